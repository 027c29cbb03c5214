"""Parse the memory facts a vLLM server prints while it starts.

vLLM logs how it spent GPU memory at startup: the weights it loaded, the memory left
for the KV cache, how many tokens / blocks that is, the concurrency it allows at
``max_model_len`` and the memory the CUDA graphs took. The wording changed between
releases; this module reads every era (see ``docs/vllm-logs.md``):

* V1 (v0.8+): ``Model loading took X GiB [memory] and T seconds``,
  ``Available KV cache memory: Y GiB``, ``GPU KV cache size: N tokens``,
  ``Maximum concurrency for L tokens per request: C x``,
  ``Graph capturing finished in S secs, took G GiB``,
  (v0.19+) ``Estimated CUDA graph memory: X GiB total``.
* V0 (<= v0.8): ``Loading model weights took X GB``,
  ``Memory profiling results: total_gpu_memory=…GiB … kv_cache_size=…GiB …`` or
  ``the current vLLM instance can use total_gpu_memory (T) x gpu_memory_utilization (u)
  = R`` / ``the rest of the memory reserved for KV Cache is K``,
  ``# GPU blocks: N, # CPU blocks: M`` (``# cuda blocks`` on some builds).
* After graph capture (v0.10.2+): ``Free memory on device (F/T GiB) on startup. Desired GPU
  memory utilization is (u, R GiB). Actual usage is W GiB for weight, A GiB for peak
  activation, N GiB for non-torch memory, and G GiB for CUDAGraph memory`` (v0.2x+: ``X GiB
  for consumed memory (weights + non-torch), A GiB for peak activation, and G GiB for
  CUDAGraph memory``).
* Failures: the free-memory check (``Free memory on device (F/T GiB) on startup …``), the
  V1 "To serve at least one request …" and the V0 "max seq len (L) is larger than the
  maximum number of tokens that can be stored in KV cache (N)" errors.

With tensor parallelism every worker prints its own lines. Per-worker values are kept
in the ``*_per_worker`` lists; the scalar fields hold the first occurrence, except
``available_kv_gib``, which is the minimum over workers (the engine sizes the KV cache
from the smallest worker).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["VllmStartupFacts", "parse_startup_log"]

_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?)"


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def _int(text: str) -> int:
    return int(float(text.replace(",", "")))


@dataclass
class VllmStartupFacts:
    """Memory facts read from a vLLM startup log; ``None`` where the log does not say."""

    weights_gib: float | None = None
    load_seconds: float | None = None
    available_kv_gib: float | None = None
    kv_cache_tokens: int | None = None
    num_gpu_blocks: int | None = None
    num_cpu_blocks: int | None = None
    max_concurrency: float | None = None
    concurrency_tokens: int | None = None
    # measured after capture when printed, else the V1-new pre-capture estimate
    cuda_graph_gib: float | None = None
    cuda_graph_estimate_gib: float | None = None
    total_gpu_memory_gib: float | None = None
    free_memory_gib: float | None = None
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    vllm_version: str | None = None
    engine: str | None = None
    non_torch_gib: float | None = None
    activation_peak_gib: float | None = None
    # v0.2x+ prints weights and non-torch memory together ("consumed memory"); from v0.21 on
    # the "peak activation" figure of that line includes the CUDA-graph estimate
    consumed_gib: float | None = None
    needed_kv_gib: float | None = None
    estimated_max_model_len: int | None = None
    max_kv_tokens_v0: int | None = None
    num_gpu_blocks_override: int | None = None
    weights_gib_per_worker: list[float] = field(default_factory=list)
    available_kv_gib_per_worker: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def has_kv_figure(self) -> bool:
        """True when the log states the KV cache size in any form."""
        return any(
            v is not None
            for v in (self.available_kv_gib, self.kv_cache_tokens, self.num_gpu_blocks)
        )


# --- weights -------------------------------------------------------------------------
_V1_WEIGHTS = re.compile(
    rf"Model loading took {_NUM} GiB(?: memory)? and {_NUM} ?s(?:ec(?:ond)?s?)?"
)
_V1_WEIGHTS_NO_TIME = re.compile(rf"Model loading took {_NUM} GiB")
_V0_WEIGHTS = re.compile(rf"Loading model weights took {_NUM} ?GB")

# --- KV cache ------------------------------------------------------------------------
_AVAILABLE_KV = re.compile(rf"Available KV cache memory: {_NUM} ?GiB")
_KV_TOKENS = re.compile(rf"GPU KV cache size: {_NUM} tokens")
_CONCURRENCY = re.compile(rf"Maximum concurrency for {_NUM} tokens per request: {_NUM} ?x")
_BLOCKS = re.compile(rf"#?\s*(?:GPU|gpu|cuda|CUDA) blocks: {_NUM},\s*#?\s*CPU blocks: {_NUM}")
# V1-early (~v0.7.1, Jan 2025) printed the GPU block count alone, without CPU blocks.
_BLOCKS_GPU_ONLY = re.compile(rf"#\s*(?:GPU|gpu|cuda|CUDA) blocks: {_NUM}")
_BLOCK_OVERRIDE = re.compile(
    rf"Overriding num_gpu_blocks={_NUM} with num_gpu_blocks_override={_NUM}"
)

# --- V0 profiling summaries ------------------------------------------------------------
_V0_PROFILE_KV = re.compile(
    r"Memory profiling results:.*?total_gpu_memory=" + _NUM + r" ?GiB"
    r".*?kv_cache_size=" + _NUM + r" ?GiB"
    r"(?:.*?gpu_memory_utilization=" + _NUM + r")?"
)
_V0_PROFILE_NON_TORCH = re.compile(r"Memory profiling results:.*?non_torch_memory=" + _NUM)
_V0_CAN_USE = re.compile(rf"total_gpu_memory \({_NUM} ?GiB\) x gpu_memory_utilization \({_NUM}\)")
_V0_RESERVED_KV = re.compile(rf"reserved for KV Cache is {_NUM} ?GiB")
_V0_NON_TORCH = re.compile(rf"non_torch_memory takes {_NUM} ?GiB")
_V0_ACT = re.compile(rf"(?:PyTorch )?activation peak memory takes {_NUM} ?GiB")

# --- CUDA graphs ----------------------------------------------------------------------
_GRAPH = re.compile(rf"Graph capturing finished in {_NUM} secs?, took {_NUM} ?GiB")
_GRAPH_ESTIMATE = re.compile(rf"Estimated CUDA graph memory: {_NUM} ?GiB")
_CG_UTIL = re.compile(r"The current --gpu-memory-utilization=" + _NUM)

# --- errors and misc ------------------------------------------------------------------
_FREE_MEM = re.compile(
    rf"Free memory on device[^(]*\({_NUM}/{_NUM} ?GiB\) on startup is less than desired "
    rf"GPU memory utilization \({_NUM}, {_NUM} ?GiB\)"
)
_V1_NOT_ENOUGH = re.compile(
    r"To serve at least one request with the models?'s max seq len \("
    + _NUM
    + r"\), \("
    + _NUM
    + r" GiB KV cache is needed, which is larger than the available KV cache memory \("
    + _NUM
    + r" GiB\)(?:\. Based on the available memory, the estimated maximum model "
    r"length is " + _NUM + r")?"
)
_V0_NOT_ENOUGH = re.compile(
    r"max seq len \(" + _NUM + r"\) is larger than the maximum number of tokens that can be "
    r"stored in KV cache \(" + _NUM + r"\)"
)
# V1-mid DEBUG/INFO after graph capture: free/total, requested, and the breakdown.
_FREE_MEM_SUMMARY = re.compile(
    rf"Free memory on device[^(]*\({_NUM}/{_NUM} ?GiB\) on startup\. Desired GPU memory "
    rf"utilization is \({_NUM}, {_NUM} ?GiB\)\. Actual usage is {_NUM} ?GiB for weight, "
    rf"{_NUM} ?GiB for peak activation, {_NUM} ?GiB for non-torch memory, and {_NUM} ?GiB "
    r"for CUDAGraph memory"
)
# v0.2x+ (V2 model runner era): weights and non-torch memory are one "consumed" figure.
_FREE_MEM_CONSUMED = re.compile(
    rf"Free memory on device[^(]*\({_NUM}/{_NUM} ?GiB\) on startup\. Desired GPU memory "
    rf"utilization is \({_NUM}, {_NUM} ?GiB\)\. Actual usage is {_NUM} ?GiB for consumed "
    rf"memory \(weights \+ non-torch\), {_NUM} ?GiB for peak activation, and {_NUM} ?GiB "
    r"for CUDAGraph memory"
)
_NO_MEMORY = re.compile(r"No available memory for the cache blocks")
_VERSION_PATTERNS = (
    re.compile(r"vLLM API server version v?([0-9][\w.+\-]*)"),
    re.compile(r"Initializing an? (V1 |V0 )?LLM engine \(v?([0-9][\w.+\-]*)\)"),
    re.compile(r"█ +version v?([0-9][\w.+\-]*)"),
)
_MAX_MODEL_LEN = re.compile(r"Using max model len ([0-9]+)")
_MAX_SEQ_LEN = re.compile(r"max_seq_len=([0-9]+)")


def _parse_version(text: str, facts: VllmStartupFacts) -> None:
    best: tuple[int, str, str | None] | None = None
    for pattern in _VERSION_PATTERNS:
        m = pattern.search(text)
        if m is None:
            continue
        if pattern.groups == 2:
            version, engine = m.group(2), (m.group(1) or "").strip() or None
        else:
            version, engine = m.group(1), None
        if best is None or m.start() < best[0]:
            best = (m.start(), version, engine)
    if best is not None:
        facts.vllm_version = best[1]
    m = _VERSION_PATTERNS[1].search(text)
    if m is not None:
        facts.engine = (m.group(1) or "").strip() or "V0"


def _parse_weights(text: str, facts: VllmStartupFacts) -> None:
    v1 = list(_V1_WEIGHTS.finditer(text))
    if v1:
        facts.weights_gib_per_worker = [_num(m.group(1)) for m in v1]
        facts.load_seconds = _num(v1[0].group(2))
    else:
        bare = list(_V1_WEIGHTS_NO_TIME.finditer(text))
        facts.weights_gib_per_worker = [_num(m.group(1)) for m in bare]
    if not facts.weights_gib_per_worker:
        facts.weights_gib_per_worker = [_num(m.group(1)) for m in _V0_WEIGHTS.finditer(text)]
    if facts.weights_gib_per_worker:
        facts.weights_gib = facts.weights_gib_per_worker[0]


def _parse_kv(text: str, facts: VllmStartupFacts) -> None:
    facts.available_kv_gib_per_worker = [_num(m.group(1)) for m in _AVAILABLE_KV.finditer(text)]
    m = _KV_TOKENS.search(text)
    if m is not None:
        facts.kv_cache_tokens = _int(m.group(1))
    m = _CONCURRENCY.search(text)
    if m is not None:
        facts.concurrency_tokens = _int(m.group(1))
        facts.max_concurrency = _num(m.group(2))
    m = _BLOCKS.search(text)
    if m is not None:
        facts.num_gpu_blocks = _int(m.group(1))
        facts.num_cpu_blocks = _int(m.group(2))
    else:
        m = _BLOCKS_GPU_ONLY.search(text)
        if m is not None:
            facts.num_gpu_blocks = _int(m.group(1))
    m = _BLOCK_OVERRIDE.search(text)
    if m is not None:
        # v0.19+ also prints this during CUDA-graph memory profiling (override=512
        # on a dummy cache), so it is kept apart from the real block count.
        facts.num_gpu_blocks_override = _int(m.group(2))


def _parse_v0_profile(text: str, facts: VllmStartupFacts) -> None:
    m = _V0_PROFILE_KV.search(text)
    if m is not None:
        facts.total_gpu_memory_gib = _num(m.group(1))
        if not facts.available_kv_gib_per_worker:
            facts.available_kv_gib_per_worker = [
                _num(x.group(2)) for x in _V0_PROFILE_KV.finditer(text)
            ]
        if m.group(3) is not None:
            facts.gpu_memory_utilization = _num(m.group(3))
    m = _V0_PROFILE_NON_TORCH.search(text)
    if m is not None:
        facts.non_torch_gib = _num(m.group(1))
    m = _V0_CAN_USE.search(text)
    if m is not None:
        facts.total_gpu_memory_gib = _num(m.group(1))
        facts.gpu_memory_utilization = _num(m.group(2))
    if not facts.available_kv_gib_per_worker:
        facts.available_kv_gib_per_worker = [
            _num(x.group(1)) for x in _V0_RESERVED_KV.finditer(text)
        ]
    m = _V0_NON_TORCH.search(text)
    if m is not None:
        facts.non_torch_gib = _num(m.group(1))
    m = _V0_ACT.search(text)
    if m is not None:
        facts.activation_peak_gib = _num(m.group(1))


def _parse_errors(text: str, facts: VllmStartupFacts) -> None:
    m = _FREE_MEM.search(text)
    if m is not None:
        facts.free_memory_gib = _num(m.group(1))
        facts.total_gpu_memory_gib = _num(m.group(2))
        facts.gpu_memory_utilization = _num(m.group(3))
        facts.errors.append(m.group(0))
    m = _FREE_MEM_SUMMARY.search(text)
    if m is not None:
        facts.free_memory_gib = _num(m.group(1))
        facts.total_gpu_memory_gib = _num(m.group(2))
        facts.gpu_memory_utilization = _num(m.group(3))
        if facts.weights_gib is None:  # the summary repeats "Model loading took" (2 decimals)
            facts.weights_gib = _num(m.group(5))
        facts.activation_peak_gib = _num(m.group(6))
        facts.non_torch_gib = _num(m.group(7))
        if facts.cuda_graph_gib is None:
            facts.cuda_graph_gib = _num(m.group(8))
    m = _FREE_MEM_CONSUMED.search(text)
    if m is not None:
        facts.free_memory_gib = _num(m.group(1))
        facts.total_gpu_memory_gib = _num(m.group(2))
        facts.gpu_memory_utilization = _num(m.group(3))
        facts.consumed_gib = _num(m.group(5))
        facts.activation_peak_gib = _num(m.group(6))
        if facts.cuda_graph_gib is None:
            facts.cuda_graph_gib = _num(m.group(7))
    m = _V1_NOT_ENOUGH.search(text)
    if m is not None:
        facts.needed_kv_gib = _num(m.group(2))
        if not facts.available_kv_gib_per_worker:
            facts.available_kv_gib_per_worker = [_num(m.group(3))]
        if m.group(4) is not None:
            facts.estimated_max_model_len = _int(m.group(4))
        facts.errors.append(m.group(0))
    m = _V0_NOT_ENOUGH.search(text)
    if m is not None:
        facts.max_kv_tokens_v0 = _int(m.group(2))
        facts.errors.append(m.group(0))
    m = _NO_MEMORY.search(text)
    if m is not None:
        facts.errors.append(m.group(0))


def parse_startup_log(text: str) -> VllmStartupFacts:
    """Read the memory facts from (part of) a vLLM startup log of any era.

    Lines may carry any prefix (``(VllmWorker rank=1 pid=…) INFO 04-29 01:07:41
    [gpu_model_runner.py:1347]``, docker-compose service names, HTML colour tags); only
    the message text is matched. Facts the log does not contain stay ``None``.
    """
    text = text.replace("\r\n", "\n")
    facts = VllmStartupFacts()
    _parse_version(text, facts)
    _parse_weights(text, facts)
    _parse_kv(text, facts)
    _parse_v0_profile(text, facts)
    _parse_errors(text, facts)
    if facts.available_kv_gib_per_worker:
        facts.available_kv_gib = min(facts.available_kv_gib_per_worker)
    m = _GRAPH.search(text)
    if m is not None:
        facts.cuda_graph_gib = _num(m.group(2))
    m = _GRAPH_ESTIMATE.search(text)
    if m is not None:
        facts.cuda_graph_estimate_gib = _num(m.group(1))
        if facts.cuda_graph_gib is None:
            facts.cuda_graph_gib = facts.cuda_graph_estimate_gib
    m = _CG_UTIL.search(text)
    if m is not None and facts.gpu_memory_utilization is None:
        facts.gpu_memory_utilization = _num(m.group(1))
    m = _MAX_MODEL_LEN.search(text) or _MAX_SEQ_LEN.search(text)
    if m is not None:
        facts.max_model_len = int(m.group(1))
    return facts
