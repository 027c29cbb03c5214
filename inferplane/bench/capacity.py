"""`inferplane capacity`: the cheapest (GPU type, TP, replicas, max_num_seqs) per model
that meets the SLO at the traffic's peak, found on the simulator's clock.

Candidates are the planner's own shapes (`candidate_shapes`: every TP where one request
fits, at the card share the plan would give it) for each GPU type and max_num_seqs level.
Each candidate's replica count is searched (doubling, then bisecting) by simulating one
replica at peak/replicas req/s (Poisson) with the scheduler and step-time model of
`inferplane sim`, in process (`simclock`); candidates are tried cheapest per replica
first, and one that cannot beat the best answer so far at its lower bound is dropped.

The binding constraint of an answer is what stops one replica fewer from meeting the SLO
(or, at one replica, what sets its size):
  * memory - one replica of the smallest shape that fits already meets the SLO: the
    model's footprint (weights + one request's KV) sets the GPU count;
  * KV capacity - with one replica fewer, requests waited for KV blocks with seats free,
    or were preempted, or the pool filled;
  * compute - with one replica fewer, the batch ran but its step time (or max_num_seqs
    queueing) broke the latency targets.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from inferplane.bench.cost import ApiPrice, GpuPrice, cost_report
from inferplane.bench.metrics import percentile
from inferplane.bench.simclock import Limits, Outcome, simulate
from inferplane.bench.traffic import ModelTraffic, Traffic
from inferplane.errors import InferplaneError
from inferplane.estimator.types import EngineSettings, MemoryEstimate
from inferplane.gpus.spec import GpuSpec
from inferplane.models.profile import ModelProfile
from inferplane.sim.frontend import api_server_work_s, coded_renderer
from inferplane.sim.timing import StepTimeModel
from inferplane.spec import FleetSpec, ModelSpec

SEQ_LEVELS: tuple[int, ...] = (16, 32, 64, 128, 256)
MAX_REPLICAS = 64
DEFAULT_PERCENTILE = 99.0
WARMUP_FRACTION = 0.2  # the first arrivals of a simulated window warm up, unmeasured
DRAIN_FRACTION = 0.2  # the last ones only keep the load on while the measured ones finish
MAX_WINDOW_FACTOR = 3  # a window grows to at most this many times --requests


@dataclass(frozen=True)
class Candidate:
    model: str
    gpu_type: str
    tensor_parallel_size: int
    max_num_seqs: int
    max_model_len: int
    gpu_memory_utilization: float
    kv_cache_blocks: int
    usd_per_gpu_hour: float
    parts: EngineParts = field(compare=False, repr=False)

    @property
    def usd_per_replica_hour(self) -> float:
        return self.usd_per_gpu_hour * self.tensor_parallel_size


@dataclass(frozen=True)
class Evaluation:
    candidate: Candidate
    replicas: int
    meets: bool
    p_ttft_ms: float
    p_tpot_ms: float
    p_e2el_ms: float
    outcome: Outcome = field(repr=False)


@dataclass
class ModelAnswer:
    model: str
    traffic: ModelTraffic
    best: Evaluation | None
    below: Evaluation | None  # the same candidate with one replica fewer (failed)
    binding: str
    detail: str
    evaluated: int
    unfit: list[str]  # GPU types where no shape fits at all

    @property
    def gpus(self) -> int:
        if self.best is None:
            return 0
        return self.best.replicas * self.best.candidate.tensor_parallel_size

    @property
    def usd_per_hour(self) -> float:
        if self.best is None:
            return 0.0
        return self.best.replicas * self.best.candidate.usd_per_replica_hour


@dataclass
class CapacityAnswer:
    models: list[ModelAnswer]
    slo: dict[str, float]
    evaluated: int
    elapsed_s: float
    prices: dict[str, GpuPrice]
    notes: list[str] = field(default_factory=list)

    @property
    def usd_per_hour(self) -> float:
        return sum(m.usd_per_hour for m in self.models)


def _limits(slo: dict[str, float], measured: int) -> Limits:
    pct = slo.get("percentile", DEFAULT_PERCENTILE)
    allowed = math.floor((1 - pct / 100.0) * measured)
    return Limits(
        ttft_s=slo["ttft_ms"] / 1000 if "ttft_ms" in slo else None,
        tpot_s=slo["tpot_ms"] / 1000 if "tpot_ms" in slo else None,
        e2el_s=slo["e2el_ms"] / 1000 if "e2el_ms" in slo else None,
        allowed_violations=allowed,
    )


def _candidates(
    model: ModelSpec,
    profile: ModelProfile,
    gpus: Sequence[str],
    prices: dict[str, GpuPrice],
    version: str,
    seq_levels: Sequence[int],
    unfit: list[str],
) -> list[Candidate]:
    from inferplane.gpus import lookup_gpu
    from inferplane.planner.sizing import UNITS, GpuType, candidate_shapes

    out: list[Candidate] = []
    for gpu_name in gpus:
        spec = lookup_gpu(gpu_name)
        price = prices.get(spec.name)
        if price is None:
            continue
        gpu_type = GpuType(spec.name, spec.total_memory_bytes, spec, max_gpus_per_node=8)
        fitted = False
        for seqs in seq_levels:
            sized = model.model_copy(update={
                "max_num_seqs": seqs, "tensor_parallel_size": "auto",
                "pipeline_parallel_size": 1,
            })
            shapes = candidate_shapes(sized, profile, gpu_type, version=version,
                                      budget_fraction=0.95)
            if not isinstance(shapes, list):
                continue
            for shape in shapes:
                util = round(min(shape.want_units, int(0.95 * UNITS)) / UNITS, 4)
                # The planner's settings for this shape (dtype, quantization, KV dtype,
                # vLLM version, batch budget) at the share the plan would give it.
                settings = replace(
                    shape.settings, tensor_parallel_size=shape.tensor_parallel_size,
                    gpu_memory_utilization=util, max_model_len=shape.max_model_len,
                    max_num_seqs=seqs,
                )
                parts = _engine_parts(profile, settings, spec)
                if parts is None:
                    continue
                fitted = True
                out.append(Candidate(
                    model.name, spec.name, shape.tensor_parallel_size, seqs,
                    parts.memory.max_model_len, util, parts.memory.num_gpu_blocks,
                    price.usd_per_gpu_hour, parts,
                ))
        if not fitted:
            unfit.append(spec.name)
    # Cheapest replica first; then more seats (more work per replica) first.
    out.sort(key=lambda c: (c.usd_per_replica_hour, c.tensor_parallel_size, -c.max_num_seqs))
    return out


@dataclass(frozen=True)
class EngineParts:
    """What a simulated engine needs: the estimator's numbers and the step-time model."""

    memory: MemoryEstimate
    timing: StepTimeModel
    coded_chat: bool = False  # chat rendered in code, not Jinja (sim.frontend)


def _engine_parts(
    profile: ModelProfile, settings: EngineSettings, gpu: GpuSpec
) -> EngineParts | None:
    """The simulator's engine for these settings (as `sim.build.build_parts`
    resolves one, but from the planner's full settings), or None when it does not fit."""
    from inferplane.estimator.memory import estimate_memory
    from inferplane.sim.build import step_time_model

    memory = estimate_memory(profile, settings, gpu=gpu)
    if not memory.fits or memory.num_gpu_blocks < 1:
        return None
    return EngineParts(memory, step_time_model(profile, memory, gpu,
                                               settings.tensor_parallel_size),
                       coded_renderer(profile.model_type))


class _Search:
    def __init__(self, traffic: ModelTraffic, slo: dict[str, float], requests: int,
                 seed: int) -> None:
        self.traffic = traffic
        self.slo = slo
        self.requests = requests
        self.seed = seed
        self.evaluated = 0
        self.single_failures: dict[tuple[str, int], Evaluation] = {}  # one replica, failed
        # Unit-rate draws, scaled per replica count; enough for the longest window.
        self._unit = traffic.arrivals(1.0, requests * MAX_WINDOW_FACTOR, seed)
        self._hashes: dict[int, dict[int, list[int]]] = {}  # block size -> index -> hashes

    def window(self, candidate: Candidate, rate: float) -> int:
        """Requests to simulate: at least `requests`, and enough that the warm-up (the first
        20%) lasts about one request's lifetime at a full batch, so the measured requests
        (the middle 60%) see the steady state rather than the ramp or the drain."""
        from inferplane.sim.timing import StepShape

        timing = candidate.parts.timing
        out = self.traffic.output_tokens.mean
        context = self.traffic.input_tokens.mean + out // 2
        seqs = candidate.max_num_seqs
        step = timing.step_time_s(StepShape(0, seqs, seqs * context, seqs * context, seqs))
        lifetime = out * step
        wanted = math.ceil(rate * lifetime / WARMUP_FRACTION)
        return max(self.requests, min(wanted, self.requests * MAX_WINDOW_FACTOR))

    def evaluate(self, candidate: Candidate, replicas: int) -> Evaluation:
        from inferplane.sim.core import EngineCore, KvCapacity

        self.evaluated += 1
        rate = self.traffic.peak_rps / replicas
        count = self.window(candidate, rate)
        arrivals = [replace(a, at_s=a.at_s / rate) for a in self._unit[:count]]
        measure_from = int(count * WARMUP_FRACTION)
        measure_until = int(count * (1 - DRAIN_FRACTION))
        limits = _limits(self.slo, measure_until - measure_from)
        m = candidate.parts.memory
        core = EngineCore(
            KvCapacity(m.num_gpu_blocks, m.block_size, m.max_num_seqs,
                       m.max_num_batched_tokens),
            candidate.parts.timing,
        )
        parts = candidate.parts
        front_s = api_server_work_s(parts.timing.calibration, self.traffic.api,
                                    parts.coded_chat)
        try:
            outcome = simulate(core, arrivals, measure_from=measure_from, limits=limits,
                               hashes=self._hashes.setdefault(m.block_size, {}),
                               measure_until=measure_until, frontend_s=front_s)
        except ValueError:  # a request longer than the whole KV pool
            outcome = Outcome(stopped_early=True, kv_blocked_steps=1)
        pct = self.slo.get("percentile", DEFAULT_PERCENTILE)
        meets = not outcome.stopped_early and outcome.violations <= (
            limits.allowed_violations or 0
        )
        result = Evaluation(
            candidate, replicas, meets,
            percentile(outcome.ttft_s, pct) * 1000, percentile(outcome.tpot_s, pct) * 1000,
            percentile(outcome.e2el_s, pct) * 1000, outcome,
        )
        if replicas == 1 and not meets:
            key = (candidate.gpu_type, candidate.tensor_parallel_size)
            self.single_failures.setdefault(key, result)
        return result

    def load_bound(self, candidate: Candidate) -> tuple[float, str]:
        """A lower bound on one replica's busy fraction at the whole peak, and its kind:
        prompt tokens not in the shared prefix must be computed (FLOPs), and every step -
        at most max_num_seqs tokens of decode - reads the weights once."""
        timing = candidate.parts.timing
        cal = timing.calibration
        if cal.fixed_prefill_step_s is not None or cal.fixed_decode_step_s is not None:
            return 0.0, "compute"
        peak = timing.gpu.bf16_tflops
        if timing.use_fp8_compute and timing.gpu.fp8_tflops is not None:
            peak = timing.gpu.fp8_tflops
        flops_per_s = peak * 1e12 * cal.compute_efficiency
        bandwidth = timing.gpu.memory_bandwidth_gbps * 1e9 * cal.bandwidth_efficiency
        n = len(self._unit)
        share = self.traffic.prefix_share
        fresh = sum(len(a.prompt_token_ids) * (1 - share) for a in self._unit) / n
        out = sum(a.output_tokens for a in self._unit) / n
        prefill = fresh * timing.cost.linear_flops_per_token / flops_per_s
        # A full batch's weight read (an MoE batch touches only some experts).
        seqs = candidate.max_num_seqs
        decode = out / seqs * timing.weight_read_s(seqs, bandwidth)
        rate = self.traffic.peak_rps
        if prefill >= decode:
            return rate * prefill, "prefill FLOPs"
        return rate * decode, "decode weight reads"

    def fewest_replicas(
        self, candidate: Candidate, budget_usd: float
    ) -> tuple[Evaluation | None, Evaluation | None]:
        """(the fewest replicas meeting the SLO, the evaluation one replica below), or
        (None, last failure) when none within MAX_REPLICAS or the budget. Replica counts
        below the load bound (a replica busier than 100%) are never simulated: a finite
        run could pass them while the queue grows without end."""
        fail: Evaluation | None = None
        bound, _kind = self.load_bound(candidate)
        start = max(1, math.ceil(bound * 1.000001))
        low, high = start - 1, start  # low fails (by the bound), high untested
        passed: Evaluation | None = None
        while high <= MAX_REPLICAS:
            if high * candidate.usd_per_replica_hour >= budget_usd:
                return None, fail
            result = self.evaluate(candidate, high)
            if result.meets:
                passed = result
                break
            fail, low, high = result, high, high * 2
        if passed is None:
            return None, fail
        below = fail
        while passed.replicas - low > 1:
            mid = (low + passed.replicas) // 2
            result = self.evaluate(candidate, mid)
            if result.meets:
                passed = result
            else:
                low, below = mid, result
        return passed, below


def _binding(best: Evaluation, below: Evaluation | None, smallest: Evaluation | None,
             slo: dict[str, float], bound_kind: str = "compute") -> tuple[str, str]:
    """`smallest`: the failed one-replica run of the smallest TP on the same GPU type, when
    the answer is one replica of a wider TP."""
    cand = best.candidate
    if best.replicas == 1 and smallest is None:
        return "memory", (f"one replica of TP {cand.tensor_parallel_size} on {cand.gpu_type} "
                          "meets the SLO; the model's weights and one request's KV set the size")
    if best.replicas == 1:
        assert smallest is not None
        below = smallest
        prefix = f"TP {smallest.candidate.tensor_parallel_size} fits but misses the SLO"
    else:
        prefix = f"with {below.replicas} replica(s)" if below is not None else ""
    if below is None:
        return "compute", (f"{best.replicas - 1} replica(s) would each be busier than 100% "
                           f"on {bound_kind} alone")
    out = below.outcome
    steps = max(1, out.steps)
    pct = f"p{slo.get('percentile', DEFAULT_PERCENTILE):g}"
    detail = prefix
    if out.ttft_s:
        detail += (f": {pct} TTFT {below.p_ttft_ms:.0f} ms, TPOT {below.p_tpot_ms:.1f} ms")
    if out.stopped_early:
        detail += (f" ({out.violations}+ requests over the SLO, stopped early)"
                   if out.violations else " (queued requests already past the TTFT target)")
    detail += f", peak KV use {out.peak_kv_usage:.0%}, {out.preemptions} preemption(s)"
    kv_pressure = out.preemptions > 0 or out.peak_kv_usage >= 0.98 or (
        out.kv_blocked_steps > 0.05 * steps
        and out.kv_blocked_steps >= max(out.seq_capped_steps, out.budget_capped_steps)
    )
    if kv_pressure:
        return "KV capacity", detail
    if out.seq_capped_steps > 0.05 * steps:
        detail += f"; queued behind max_num_seqs={cand.max_num_seqs}"
    elif out.budget_capped_steps > 0.05 * steps:
        detail += "; prefill-bound (token budget per step spent)"
    return "compute", detail


def plan_capacity(
    fleet: FleetSpec,
    traffic: Traffic,
    *,
    gpus: Sequence[str],
    prices: dict[str, GpuPrice],
    slo: dict[str, float],
    requests: int = 160,
    seq_levels: Sequence[int] = SEQ_LEVELS,
    seed: int = 0,
    profiles: dict[str, ModelProfile] | None = None,
) -> CapacityAnswer:
    """Size every model of `traffic` (each must be a placed model of `fleet`)."""
    from inferplane.models import load_profile

    if not any(k in slo for k in ("ttft_ms", "tpot_ms", "e2el_ms")):
        raise InferplaneError("capacity needs a latency target", field="slo",
                              fix="--slo ttft_ms=2000,tpot_ms=50 (or slo: in the traffic file)")
    if requests < 20:
        raise InferplaneError("must be >= 20", field="requests", value=requests,
                              fix="use 160 (default) or more")
    started = time.perf_counter()
    answers: list[ModelAnswer] = []
    notes: list[str] = []
    missing = [g for g in gpus if _price_key(g) not in prices]
    if missing:
        notes.append(f"no price for {', '.join(missing)}: skipped (add --price GPU=USD)")
    total = 0
    for name, model_traffic in traffic.models.items():
        model = fleet.model(name)
        if model is None or model.source is None:
            raise InferplaneError(
                "not a model of the fleet that runs on its GPUs", field=f"traffic.models.{name}",
                value=name, fix=f"use one of {[m.name for m in fleet.placed_models]}",
            )
        if (profiles or {}).get(name) is None and not Path(model.source).exists():
            from inferplane.spec.sources import missing_source_error

            raise missing_source_error(name, model.source)
        profile = (profiles or {}).get(name) or load_profile(model.source)
        unfit: list[str] = []
        levels = sorted({*seq_levels, *([model.max_num_seqs] if model.max_num_seqs else [])})
        candidates = _candidates(model, profile, gpus, prices, fleet.engine.version,
                                 levels, unfit)
        search = _Search(model_traffic, slo, requests, seed)
        best: Evaluation | None = None
        below: Evaluation | None = None
        for candidate in candidates:
            budget = best.replicas * best.candidate.usd_per_replica_hour if best else math.inf
            found, under = search.fewest_replicas(candidate, budget)
            if found is not None:
                best, below = found, under
        total += search.evaluated
        if best is None:
            answers.append(ModelAnswer(
                name, model_traffic, None, None, "memory" if not candidates else "compute",
                "no shape fits the GPUs given" if not candidates else
                f"no candidate meets the SLO with up to {MAX_REPLICAS} replicas",
                search.evaluated, unfit,
            ))
            continue
        smallest_tp = min(c.tensor_parallel_size for c in candidates
                          if c.gpu_type == best.candidate.gpu_type)
        smallest = None
        wider = best.replicas == 1 and best.candidate.tensor_parallel_size > smallest_tp
        if wider:
            smallest = search.single_failures.get((best.candidate.gpu_type, smallest_tp))
        if wider and smallest is None:  # never simulated: the load bound ruled it out
            small = next(c for c in candidates if c.gpu_type == best.candidate.gpu_type
                         and c.tensor_parallel_size == smallest_tp)
            load, kind = search.load_bound(small)
            binding, detail = "compute", (
                f"TP {smallest_tp} fits, but one replica of it would be {load:.0%} busy on "
                f"{kind} alone")
        else:
            binding, detail = _binding(best, below, smallest, slo,
                                       search.load_bound(best.candidate)[1])
        answers.append(ModelAnswer(name, model_traffic, best, below, binding, detail,
                                   search.evaluated, unfit))
        notes.extend(_timing_band(name, best.candidate))
    return CapacityAnswer(answers, slo, total, time.perf_counter() - started, prices, notes)


def _timing_band(model: str, candidate: Candidate) -> list[str]:
    """The simulator's measured error for this GPU type and model family (error_bands)."""
    from inferplane.sim.error_bands import band_lines

    cost = candidate.parts.timing.cost
    return band_lines(model, candidate.parts.timing.gpu, cost.num_experts > 0,
                      cost.weight_format)


def _price_key(name: str) -> str:
    from inferplane.gpus import find_gpu

    spec = find_gpu(name)
    return spec.name if spec is not None else name


def model_cost(answer: ModelAnswer, api: ApiPrice | None) -> dict[str, Any] | None:
    """$/1M tokens at the peak's throughput and over the traffic's day, for one model."""
    if answer.best is None:
        return None
    t = answer.traffic
    mean_in = t.input_tokens.mean
    mean_out = t.output_tokens.mean
    report = cost_report(answer.usd_per_hour, t.peak_rps * mean_in, t.peak_rps * mean_out, api)
    daily_out = t.daily_requests * mean_out
    report["daily_output_tokens"] = daily_out
    report["usd_per_m_output_tokens_over_the_day"] = (
        report["usd_per_day"] / daily_out * 1e6 if daily_out else None
    )
    if api is not None:
        report["api_usd_per_day"] = api.usd_for(t.daily_requests * mean_in, daily_out)
        if "breakeven_output_tokens_per_day" in report:
            report["breakeven_requests_per_day"] = (
                report["breakeven_output_tokens_per_day"] / mean_out
            )
    return report


NODE_GPUS = 8


def _nodes(replicas_by_type: dict[str, list[int]]) -> list[dict[str, Any]]:
    """Nodes of up to 8 GPUs per type holding every replica's TP group (first fit,
    largest first), so each TP group fits one node."""
    nodes: list[dict[str, Any]] = []
    for gpu_type, tps in replicas_by_type.items():
        bins: list[int] = []
        for tp in sorted(tps, reverse=True):
            for i, used in enumerate(bins):
                if used + tp <= NODE_GPUS:
                    bins[i] += tp
                    break
            else:
                bins.append(tp)
        slug = gpu_type.lower()
        nodes += [{"name": f"{slug}-{i + 1}", "gpu_type": gpu_type, "count": used}
                  for i, used in enumerate(bins)]
    return nodes


def fleet_fragment(fleet: FleetSpec, raw: dict[str, Any], answer: CapacityAnswer) -> dict[str, Any]:
    """A fleet file `inferplane plan` takes: the fleet's engine, the GPUs the answer
    needs, and the sized models (their own settings plus TP, replicas, max_num_seqs and
    the GPU type)."""
    raw_models = {str(m.get("name")): m for m in raw.get("models") or [] if isinstance(m, dict)}
    models: list[dict[str, Any]] = []
    by_type: dict[str, list[int]] = {}
    for ans in answer.models:
        if ans.best is None:
            continue
        cand = ans.best.candidate
        spec = fleet.model(ans.model)
        assert spec is not None
        entry = {k: v for k, v in raw_models.get(ans.model, {"name": ans.model}).items()
                 if k not in ("pipeline_parallel_size", "endpoints")}
        entry["source"] = spec.source
        entry["tensor_parallel_size"] = cand.tensor_parallel_size
        entry["replicas"] = ans.best.replicas
        entry["max_num_seqs"] = cand.max_num_seqs
        placement = {k: v for k, v in (entry.get("placement") or {}).items()
                     if k not in ("node", "gpu_type", "colocate_with")}
        placement["gpu_type"] = cand.gpu_type
        entry["placement"] = placement
        models.append(entry)
        by_type.setdefault(cand.gpu_type, []).extend(
            [cand.tensor_parallel_size] * ans.best.replicas
        )
    out: dict[str, Any] = {}
    if "engine" in raw:
        out["engine"] = raw["engine"]
    out["gpus"] = {"nodes": _nodes(by_type)}
    out["models"] = models
    return out


def answer_dict(answer: CapacityAnswer, api: ApiPrice | None) -> dict[str, Any]:
    """The `--json` schema of `inferplane capacity`."""
    models = []
    for m in answer.models:
        row: dict[str, Any] = {
            "model": m.model, "peak_rps": m.traffic.peak_rps, "binding": m.binding,
            "detail": m.detail, "evaluated": m.evaluated, "unfit_gpu_types": m.unfit,
        }
        if m.best is not None:
            c = m.best.candidate
            row.update({
                "gpu_type": c.gpu_type, "tensor_parallel_size": c.tensor_parallel_size,
                "replicas": m.best.replicas, "max_num_seqs": c.max_num_seqs,
                "max_model_len": c.max_model_len,
                "gpu_memory_utilization": c.gpu_memory_utilization,
                "kv_cache_blocks": c.kv_cache_blocks, "gpus": m.gpus,
                "usd_per_gpu_hour": c.usd_per_gpu_hour,
                "price_source": answer.prices[c.gpu_type].source,
                "usd_per_hour": m.usd_per_hour,
                "p_ttft_ms": m.best.p_ttft_ms, "p_tpot_ms": m.best.p_tpot_ms,
                "p_e2el_ms": m.best.p_e2el_ms,
                "peak_kv_usage": m.best.outcome.peak_kv_usage,
                "preemptions": m.best.outcome.preemptions,
                "prefix_hit_rate": m.best.outcome.prefix_hit_rate,
                "cost": model_cost(m, api),
            })
        models.append(row)
    return {
        "slo": answer.slo,
        "models": models,
        "total_gpus": sum(m.gpus for m in answer.models),
        "usd_per_hour": answer.usd_per_hour,
        "evaluated_configurations": answer.evaluated,
        "elapsed_s": answer.elapsed_s,
        "notes": answer.notes,
    }
