"""Numbers for fix templates, computed by the estimator from the model and GPU a log names.

Each function takes the `FixContext` (model profile, GPU, the engine settings the log
states) and the numbers already read from the log, and returns more numbers as strings for
the signature's `fix` template. A function returns only what it can compute; a template
whose numbers are missing falls back to the signature's `fix_generic`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from inferplane.doctor.logtext import LogContext

if TYPE_CHECKING:
    from inferplane.estimator.types import EngineSettings, MemoryEstimate
    from inferplane.gpus.spec import GpuSpec
    from inferplane.models.profile import ModelProfile

GIB = 1024**3
CONTEXT_GIB = 0.5  # per-process CUDA context outside the utilization budget (P01)
SMALL_CAPTURE_SIZES = (1, 2, 4, 8)

Values = dict[str, str]


@dataclass
class FixContext:
    log: LogContext
    profile: ModelProfile | None = None
    gpu: GpuSpec | None = None
    gpu_total_bytes: int | None = None  # when no catalog GPU is known
    used_estimator: bool = False  # set when a fix number came from the estimator
    assumed_version: str | None = None  # the release the message's wording implies

    @property
    def version(self) -> str | None:
        return self.log.vllm_version or self.assumed_version

    @property
    def has_hardware(self) -> bool:
        return self.gpu is not None or self.gpu_total_bytes is not None

    @property
    def tp(self) -> int:
        return self.log.tensor_parallel_size or 1

    @property
    def utilization(self) -> float:
        return self.log.gpu_memory_utilization or 0.9

    def basis(self) -> str:
        assert self.profile is not None
        gpu = self.gpu.name if self.gpu else f"{(self.gpu_total_bytes or 0) / GIB:.2f} GiB GPU"
        version = f", vLLM {self.version}" if self.version else ""
        return (f"{self.profile.name} on {gpu}, TP {self.tp}, "
                f"utilization {self.utilization:.2f}{version}")

    def settings(self, **changes: object) -> EngineSettings:
        from inferplane.estimator.types import EngineSettings

        base: dict[str, object] = {
            "tensor_parallel_size": self.tp,
            "gpu_memory_utilization": self.utilization,
            "max_model_len": self.log.max_model_len,
            "vllm_version": self.version,
        }
        if self.log.dtype in ("float16", "bfloat16", "float32", "half"):
            base["dtype"] = "float16" if self.log.dtype == "half" else self.log.dtype
        base.update(changes)
        return EngineSettings(**base)  # type: ignore[arg-type]

    def estimate(self, **changes: object) -> MemoryEstimate | None:
        from inferplane.errors import InferplaneError
        from inferplane.estimator.memory import estimate_memory

        if self.profile is None or not self.has_hardware:
            return None
        try:
            est = estimate_memory(
                self.profile, self.settings(**changes), gpu=self.gpu,
                gpu_memory_bytes=None if self.gpu else self.gpu_total_bytes,
            )
        except (InferplaneError, ValueError):
            return None
        self.used_estimator = True
        return est


def _fmt(value: float) -> str:
    return f"{value:.2f}"


def _valid_tp(ctx: FixContext, limit: int = 16) -> list[int]:
    from inferplane.estimator.rules import valid_tp_sizes

    assert ctx.profile is not None
    return valid_tp_sizes(ctx.profile, limit=limit)


def kv_fit(ctx: FixContext, got: Values) -> Values:
    """P02: the longest max_model_len that fits (auto-fit of the estimator), the smallest TP
    that fits, utilization steps."""
    out: Values = {}
    util = ctx.utilization
    out["utilization_up"] = _fmt(min(0.95, util + 0.05))
    out["tp"] = str(ctx.tp)
    log_fit = got.get("log_max_len") or got.get("kv_tokens")
    out["log_fit_basis"] = "what the log says fits"
    if not log_fit and got.get("needed_gib") and got.get("available_gib") and got.get(
            "max_model_len"):
        # older V1 wording names both budgets but no length: the KV cache of full attention
        # grows linearly with length, so scale (an estimate; sliding windows fit more)
        scaled = int(got["max_model_len"]) * float(got["available_gib"]) / float(
            got["needed_gib"])
        if scaled >= 16:
            log_fit = str(int(scaled) // 16 * 16)
            out["log_fit_basis"] = "the log's KV budget scaled to length, an estimate"
    if log_fit:
        out["log_fit"] = log_fit
    # a report in words names neither length: say so rather than leave a number missing
    out["log_fit_text"] = (f"{log_fit} or lower ({out['log_fit_basis']})" if log_fit else
                           "explicitly, below the model's default (the log names no length "
                           "that fits)")
    out["max_model_len_text"] = (f"{got['max_model_len']} tokens" if got.get("max_model_len")
                                 else "the model's default (the log does not say how long)")
    auto = ctx.estimate(max_model_len=-1)
    if auto is not None and ctx.profile is not None:
        from inferplane.planner.sizing import safe_band

        out["weights_gib"] = _fmt(auto.weights_gib)
        out["total_gib"] = _fmt(auto.total_memory_gib)
        out["safe_utilization"] = _fmt(min(util, safe_band(ctx.profile, ctx.settings())))
        valid = _valid_tp(ctx)
        bigger = [t for t in valid if t > ctx.tp]
        out["next_tp"] = str(bigger[0]) if bigger else str(ctx.tp)
        failing = int(got.get("max_model_len") or ctx.log.max_model_len or 0)
        fit = _longest_fit(ctx, failing - 1) if failing > 1 else (
            auto.max_model_len if auto.fits else None)
        if fit is not None:
            out["max_model_len_fit"] = str(fit)
            own = f"; the log's own figure is {log_fit}" if log_fit else ""
            out["fit_basis"] = f" for {ctx.basis()}, by the estimator{own}"
        for tp in valid:
            est = ctx.estimate(tensor_parallel_size=tp, max_model_len=-1)
            if est is not None and est.fits:
                out["min_tp_fit"] = str(tp)
                out["tp_advice"] = (
                    f"the smallest TP that fits is {tp}" if tp > ctx.tp else
                    f"TP {ctx.tp} fits by the estimator, so memory is held by something else "
                    "(another process on the GPU, P22) or the utilization is too low")
                break
    elif log_fit:
        out["max_model_len_fit"] = log_fit
        out["fit_basis"] = ", as the log itself computes"
        out["next_tp"] = str(ctx.tp * 2)
        out["safe_utilization"] = _fmt(min(util, 0.9))
    return out


def _longest_fit(ctx: FixContext, upper: int, step: int = 16) -> int | None:
    """The largest max_model_len <= `upper` (a multiple of `step`) that the estimator says
    fits, checked at that exact length (vLLM's activation profile depends on it)."""
    def fits(length: int) -> bool:
        est = ctx.estimate(max_model_len=length)
        return est is not None and est.fits

    lo, hi = 1, upper // step  # in steps
    if hi < 1 or not fits(step):
        return None
    if fits(hi * step):
        return hi * step
    while hi - lo > 1:  # fits(lo * step) and not fits(hi * step)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid * step) else (lo, mid)
    return lo * step


def free_memory(ctx: FixContext, got: Values) -> Values:
    """P01/P19: the utilization the free memory allows, and what fits in it."""
    if "free_gib" not in got or "total_gib" not in got:
        # a report in words names no figures: say so, and the fix without numbers is shown
        return {"held_text": "Part of the card (the report gives no figures) is"}
    free = float(got["free_gib"])
    total = float(got["total_gib"])
    out: Values = {"held_gib": _fmt(total - free),
                   "held_text": f"{_fmt(total - free)} GiB of the {got['total_gib']} GiB are"}
    best = math.floor((free - CONTEXT_GIB) / total * 100) / 100 if total > 0 else 0.0
    if best <= 0:
        out["max_utilization"] = "0.00"
        out["fit_note"] = "; that is nothing: this card is full, so use another GPU"
        return out
    out["max_utilization"] = f"{best:.2f}"
    out["fit_note"] = ""
    if ctx.profile is not None:
        if not ctx.has_hardware:
            ctx.gpu_total_bytes = round(total * GIB)
        est = ctx.estimate(gpu_memory_utilization=best, max_model_len=-1)
        if est is not None and est.fits:
            out["fit_note"] = (f"; {ctx.profile.name} then fits with max_model_len "
                               f"{est.max_model_len}, by the estimator")
        elif est is not None:
            out["fit_note"] = (f"; but {ctx.profile.name} does not fit in that share "
                               "(by the estimator), so move it to another GPU")
    return out


def graph_oom(ctx: FixContext, got: Values) -> Values:
    """P05: the CUDA-graph pool now and with four capture sizes."""
    out: Values = {"utilization_down": _fmt(max(0.5, ctx.utilization - 0.05))}
    est = ctx.estimate()
    if est is None or ctx.profile is None:
        return out
    from inferplane.planner.sizing import graph_bytes

    out["graph_full_gib"] = _fmt(est.cuda_graph_gib)
    out["graph_small_gib"] = _fmt(graph_bytes(ctx.profile, SMALL_CAPTURE_SIZES) / GIB)
    return out


def tp_sizes(ctx: FixContext, got: Values) -> Values:
    """P11: the valid TP sizes, from the model's heads (and KV heads) when the model is
    known, else from the head count in the message."""
    tp = int(got.get("tp") or ctx.tp)
    said_tp = got.get("tp") or ctx.log.tensor_parallel_size
    out: Values = {"tp_text": f"TP {said_tp}" if said_tp else
                   "the --tensor-parallel-size asked for (the log does not say which)",
                   "sizes_text": "no size is computed here"}
    if ctx.profile is not None:
        ctx.used_estimator = True  # the model's real head counts
        valid = _valid_tp(ctx, limit=max(16, tp))
        heads = f"the model's {ctx.profile.num_attention_heads} attention heads / " \
                f"{ctx.profile.num_kv_heads} KV heads"
    else:
        n_heads, n_kv = int(got.get("heads") or 0), int(got.get("kv_heads") or 0)
        # a valid size divides both counts when the log names both (28 heads, 4 KV heads)
        count = math.gcd(n_heads, n_kv) if n_heads and n_kv else n_heads or n_kv
        if count == 0:  # the rule quoted without its numbers: nothing to compute from
            out["heads_text"] = ("the model's attention heads (the log names neither their "
                                 "count nor the model)")
            return out  # no valid_tp: the fix without numbers (fix_generic) is shown
        valid = [d for d in range(1, min(count, 64) + 1) if count % d == 0]
        if n_heads and n_kv:
            heads = f"the {n_heads} attention heads and {n_kv} KV heads"
        else:
            heads = f"the {count} {'attention' if n_heads else 'KV'} heads"
    out["heads_text"] = heads
    if not said_tp:  # the size asked for is cut from the message: list the sizes, pick none
        out["sizes_text"] = f"sizes that divide {heads}: {', '.join(map(str, valid))}"
        return out
    out |= {"valid_tp_list": ", ".join(map(str, valid)), "tp": str(said_tp)}
    smaller = [t for t in valid if t < tp]
    out["valid_tp"] = str(smaller[-1] if smaller else valid[0]) if valid else "1"
    return out


# Serving flags that `vllm serve` rejects besides the builder's REMOVED_FLAGS table (these are
# never emitted by the builder): (release that rejects it, what to write instead).
_SERVE_REJECTS = {
    "task": ("0.13.0", "--runner pooling for embedding/rerank/reward models (plus --convert "
                       "embed to adapt a generative one), --runner generate otherwise; --task "
                       "itself existed only from about 0.6.4 (deprecated in 0.10), so an older "
                       "image needs an upgrade instead"),
}


def bf16_gpu(ctx: FixContext, got: Values) -> Values:
    """The GPU the bfloat16 check refused, in whatever detail the log gives (a traceback cut
    before the message names neither the GPU nor its compute capability)."""
    name, cap = got.get("gpu_name"), got.get("capability")
    if name and cap:
        text = f"{name} (compute capability {cap})"
    elif name or cap:
        text = f"{name}" if name else f"this GPU (compute capability {cap})"
    else:
        text = ("this GPU (the log names neither it nor its compute capability; bfloat16 "
                "needs 8.0)")
    return {"gpu_text": text}


def removed_flags(ctx: FixContext, got: Values) -> Values:
    """P32: for each rejected flag, when it was removed and what replaces it."""
    from inferplane.engines.vllm.flags import REMOVED_FLAGS

    args = got.get("args", "")
    if not args and got.get("kwarg"):  # the Python API: EngineArgs(disable_log_requests=...)
        args = "--" + got["kwarg"].replace("_", "-")
    parts = []
    known = False
    for flag in re.findall(r"--([\w-]+)", args):
        name = flag.replace("_", "-")
        removed = REMOVED_FLAGS.get(name.removeprefix("no-"))
        rejected = _SERVE_REJECTS.get(name)
        if removed is not None:
            known = True
            since = ".".join(str(p) for p in removed.removed_in)
            parts.append(f"remove --{name} (removed in vLLM {since}); instead: "
                         f"{removed.replacement}")
        elif rejected is not None:
            known = True
            parts.append(f"remove --{name} (`vllm serve` {rejected[0]} and later reject it); "
                         f"instead: {rejected[1]}")
        else:
            parts.append(f"--{name} is not a flag of this vLLM: check `vllm serve --help` "
                         "for its spelling in this release (flags from newer docs do not "
                         "exist in older images)")
    if not known and re.search(r"--[\w-]+ [^-\s]", args) and "'" not in args:
        parts.append("if flag and value arrived as one argument (a YAML list item like "
                     "'--dtype auto'), split them into two items")
    return {"flag_fixes": "; ".join(parts) + "." if parts else "Remove the flags.",
            "args_text": args or "a flag"}


def uuid_index(ctx: FixContext, got: Values) -> Values:
    uuid = got.get("uuid")
    # a report in words names no UUID: say so instead of leaving a hole
    text = f"{uuid} is a UUID" if uuid else "an entry there is a UUID (the log does not show it)"
    return {"uuid_short": (uuid or "GPU-")[:12], "uuid_text": text}


def driver_found(ctx: FixContext, got: Values) -> Values:
    found = got.get("found")
    if not found:
        return {"found_text": ""}
    n = int(found)
    return {"found_text": f" (the driver supports up to CUDA {n // 1000}.{n % 1000 // 10})"}


def nccl_timeout(ctx: FixContext, got: Values) -> Values:
    ran = got.get("ran_ms")
    # the shorter wording has no duration: say so instead of a placeholder
    return {"ran_text": f"in {int(ran) / 1000:.0f} s" if ran else "before the watchdog's timeout",
            "op": got.get("op", "collective")}


def shm_size(ctx: FixContext, got: Values) -> Values:
    size = got.get("size_bytes")
    return {"size_text": f" (NCCL asked for {int(size) / 2**20:.1f} MiB)" if size else ""}


def body_limit(ctx: FixContext, got: Values) -> Values:
    size = got.get("body_bytes")
    if not size:
        return {"body_text": "", "body_limit": "64m"}
    mib = int(size) / 2**20
    limit = max(16, 2 ** math.ceil(math.log2(max(mib * 2, 1))))
    return {"body_text": f" (this request had {mib:.1f} MiB)", "body_limit": f"{limit}m"}


def startup_probe(ctx: FixContext, got: Values) -> Values:
    """P24: the startup budget for the model's weights at the default disk bandwidth."""
    est = ctx.estimate()
    if est is None:
        return {}
    from inferplane.runtime.vllm_fleet import DEFAULT_DISK_BANDWIDTH_MIB_S, startup_deadline_s

    weights = est.weights_gib * ctx.tp * GIB
    return {
        "startup_s": f"{math.ceil(startup_deadline_s(int(weights)))}",
        "weights_gib": _fmt(weights / GIB),
        "disk_mib_s": f"{DEFAULT_DISK_BANDWIDTH_MIB_S:.0f}",
    }


COMPUTE: dict[str, Callable[[FixContext, Values], Values]] = {
    "kv_fit": kv_fit,
    "free_memory": free_memory,
    "graph_oom": graph_oom,
    "tp_sizes": tp_sizes,
    "removed_flags": removed_flags,
    "uuid_index": uuid_index,
    "driver_found": driver_found,
    "nccl_timeout": nccl_timeout,
    "shm_size": shm_size,
    "body_limit": body_limit,
    "startup_probe": startup_probe,
}


def k8s_nodes(ctx: FixContext, got: Values) -> Values:
    if got.get("nodes") and got.get("short"):
        return {"nodes_text": f"{got['short']} of {got['nodes']} nodes"}
    return {"nodes_text": "the nodes"}


COMPUTE["k8s_nodes"] = k8s_nodes


def kv_capacity(ctx: FixContext, got: Values) -> Values:
    """P09: the KV tokens and full-length sequences the cache holds, by the estimator."""
    out: Values = {"preemptions_text": _preemptions_text(got)}
    est = ctx.estimate()
    if est is not None and not est.fits:  # the log's length does not fit: what would
        est = ctx.estimate(max_model_len=-1)
    if est is None or not est.fits:
        return out
    bigger = [t for t in _valid_tp(ctx) if t > ctx.tp] if ctx.profile else []
    return out | {
        "kv_tokens_fit": f"{est.kv_cache_tokens}",
        "seqs_fit": f"{max(1, math.floor(est.max_concurrency))}",
        "max_len_fit": f"{est.max_model_len}",
        "basis": ctx.basis() + ", by the estimator",
        "utilization_up": _fmt(min(0.95, ctx.utilization + 0.05)),
        "next_tp": str(bigger[0]) if bigger else str(ctx.tp),
    }


COMPUTE["kv_capacity"] = kv_capacity


def _preemptions_text(got: Values) -> str:
    """What the log shows of the preemptions: V0 counts them, V1's stats line shows the
    full cache and the queue, a report in words shows neither."""
    if got.get("preemptions"):
        return f"{got['preemptions']} preemptions so far"
    if got.get("usage") and got.get("waiting"):
        return f"KV cache usage {got['usage']}% with {got['waiting']} requests waiting"
    return "the log does not count the preemptions"


def oom_startup(ctx: FixContext, got: Values) -> Values:
    """kv_fit, plus the allocation the message names (when it names one)."""
    out = kv_fit(ctx, got)
    alloc, unit = got.get("alloc"), got.get("alloc_unit")
    out["alloc_text"] = f" (it tried to allocate {alloc} {unit})" if alloc and unit else ""
    return out


def sampler_seqs(ctx: FixContext, got: Values) -> Values:
    """vllm#27508: the sampler warm-up runs max_num_seqs dummy requests over the vocabulary
    after the KV cache is allocated (V1 `compile_or_warm_up_model`), so it must fit in what
    --gpu-memory-utilization leaves outside its budget, less the CUDA context and the graphs
    captured outside the budget. Counting only that headroom is conservative: it ignores the
    freed profile-run space, which graphs and fragmentation eat in practice (llm-d#787)."""
    from inferplane.estimator.overheads import sampler_bytes_per_logit

    reqs = int(got.get("dummy_reqs") or 0)
    out: Values = {"utilization_down": _fmt(max(0.5, ctx.utilization - 0.05)),
                   "seqs_half": str(max(1, reqs // 2)),
                   "sampler_text": "memory proportional to max_num_seqs x vocabulary size"}
    # a cut traceback or a title names the warm-up but not its size: say so, and advise
    # by ratio (the sampler's memory is linear in the request count)
    if reqs >= 1:
        out["dummy_reqs_text"] = f"{reqs} dummy requests"
        out["seqs_advice"] = (f"{max(1, reqs // 2)} (half the {reqs} the warm-up used) takes "
                              "half the sampler memory")
    else:
        out["dummy_reqs_text"] = ("max_num_seqs dummy requests (the log does not say how "
                                  "many)")
        out["seqs_advice"] = ("set it explicitly below the default this vLLM chose for the "
                              "GPU (halving it halves the sampler memory)")
    if ctx.profile is None or reqs < 2:
        return out
    from inferplane.engines.vllm.versions import DEFAULT_VLLM_VERSION

    est = ctx.estimate(max_num_seqs=reqs, max_model_len=ctx.log.max_model_len or -1)
    # the sampler's bytes per logit depend on the release: the one the estimate is for
    version = est.vllm_version if est is not None else (ctx.version or DEFAULT_VLLM_VERSION)
    per_seq = ctx.profile.vocab_size * sampler_bytes_per_logit(version)
    need = reqs * per_seq
    out["sampler_text"] = (f"about {need / GIB:.2f} GiB for {ctx.profile.name} "
                           f"({ctx.profile.vocab_size} tokens x {reqs} requests, vLLM "
                           f"{version}'s sampler)")
    if est is None:
        return out
    outside = est.cuda_context_gib + (0.0 if est.cuda_graph_in_budget else est.cuda_graph_gib)
    headroom = est.total_memory_gib * (1 - est.gpu_memory_utilization) - outside
    fit = math.floor(max(0.0, headroom) * GIB / per_seq)
    fit = fit - fit % 8 if fit >= 8 else fit
    util = math.floor((1 - (need / GIB + outside) / est.total_memory_gib) * 100) / 100
    out["utilization_down"] = _fmt(max(0.5, min(util, ctx.utilization - 0.01)))
    if 1 <= fit < reqs:
        out["seqs_fit"] = str(fit)
        out["seqs_basis"] = (f"its warm-up needs {fit * per_seq / GIB:.2f} GiB of the "
                             f"{headroom:.2f} GiB left outside the utilization budget, for "
                             f"{ctx.basis()}, by the estimator")
    elif fit >= reqs:  # the estimate says it fits: something it does not see holds memory
        out["seqs_fit"] = str(max(1, reqs // 2))
        out["seqs_basis"] = (f"by the estimator the warm-up's {need / GIB:.2f} GiB fits in the "
                             f"{headroom:.2f} GiB outside the budget for {ctx.basis()}, so "
                             "memory is held by something it does not see (another process, "
                             "fragmentation); half the requests halve the warm-up")
    return out


def _cap(digits: str) -> str:
    return f"{digits[:-1]}.{digits[-1]}"


def fp8_caps(ctx: FixContext, got: Values) -> Values:
    cur, low, method = got.get("cur_cap"), got.get("min_cap"), got.get("method")
    if not (cur and len(cur) >= 2):
        return {"cap_text": ""}
    text = f"; this GPU is {_cap(cur)}"
    if method and method.lower() != "fp8" and low and len(low) >= 2:
        # another FP8/FP4 format (mxfp4, nvfp4) with its own, often higher, minimum
        text += f", and this vLLM needs {_cap(low)} for {method}"
    return {"cap_text": text}


def cpu_kv(ctx: FixContext, got: Values) -> Values:
    """The host-RAM KV cache that did not fit: the CPU backend's whole cache, or V0's swap
    space (the CPU blocks for preempted requests), whichever the log names."""
    kv, total = got.get("kv_gib"), got.get("total_gib")
    if got.get("swap_space"):
        sizes = (
            f"{kv} GiB of the host's {total} GiB was asked"
            if kv and total
            else "the log does not give the sizes"
        )
        return {
            "kv_cause": (
                "vLLM V0 pins --swap-space GiB of host RAM per GPU (4 by default) as "
                "CPU KV cache blocks for swapped-out requests at start-up: it refuses "
                "more than 70% of the host's total memory, and crashes when less is "
                f"free; {sizes}."
            ),
            "kv_fix": (
                "Lower --swap-space (swap_space= in the Python API or a wrapper's engine "
                "config; 0 turns it off, and V1 engines have none) below what the host "
                "has free, or give the host (container) more RAM"
            ),
        }
    node, free = got.get("node"), got.get("free_gib")
    sizes = (
        f"{kv} GiB was asked (--kv-cache-memory-bytes or VLLM_CPU_KVCACHE_SPACE) and NUMA "
        f"node {node} had {free} of {total} GiB free"
        if kv and node and free and total
        else "more was asked (--kv-cache-memory-bytes or VLLM_CPU_KVCACHE_SPACE) than the "
        "host had free; the log does not give the sizes"
    )
    return {
        "kv_cause": (
            f"vLLM's CPU worker allocates the whole KV cache in host RAM at start-up; {sizes}."
        ),
        "kv_fix": (
            f"Ask for less than {f'{free} GiB' if free else 'the free memory'} minus "
            "what the other engines on the host still need (--kv-cache-memory-bytes 1G "
            "is plenty for small models), or stop what holds the memory"
        ),
    }


def ray_node(ctx: FixContext, got: Values) -> Values:
    node = got.get("node")
    return {"node_text": f"here node:{node}" if node else "the log does not show which node"}


def disk_path(ctx: FixContext, got: Values) -> Values:
    path = got.get("path")
    return {"path_text": f": {path}" if path else ""}


def library_text(ctx: FixContext, got: Values) -> Values:
    lib = got.get("library")
    return {"library_text": lib if lib else "A compiled extension"}


def derived_len(ctx: FixContext, got: Values) -> Values:
    out: Values = {
        "derived_text": got.get("derived") or "the log does not print the derived length",
        "max_model_len_text": got.get("max_model_len") or "(the log does not say which length)",
    }
    numbers = [int(n) for n in re.findall(r"=([0-9]+)", got.get("derived", ""))]
    if numbers:
        return out | {"derived_len": str(min(numbers))}
    return out | {"derived_len": "the length config.json gives (max_position_embeddings)"}


def arch_text(ctx: FixContext, got: Values) -> Values:
    archs = got.get("archs")
    if archs:
        return {"archs_text": f"The architecture {archs} from config.json",
                "archs_name": archs, "import_text": ""}
    err = got.get("import_error")
    return {"archs_text": "The architecture in config.json",
            "archs_name": "the model's architecture",
            "import_text": f" (here: {err})" if err else ""}


COMPUTE.update({
    "arch_text": arch_text,
    "oom_startup": oom_startup, "sampler_seqs": sampler_seqs, "bf16_gpu": bf16_gpu,
    "fp8_caps": fp8_caps, "cpu_kv": cpu_kv,
    "ray_node": ray_node, "disk_path": disk_path, "library_text": library_text,
    "derived_len": derived_len,
})
