"""Per-model sizing on one GPU type: tensor-parallel size, the utilization range, the length.

For each (model, GPU type) the planner needs a `Shape`: how many GPUs one replica takes and
what fraction of each card it needs, as a range:

* `min_units`  - weights, activations, non-torch buffers, CUDA graphs and the KV cache for
  ONE request at max_model_len (vLLM refuses less, P02), plus headroom;
* `want_units` - the same with the requested concurrency (`max_num_seqs` x `max_model_len`,
  P09), capped at the P06 safe band for the model's dtype and size (0.85 for 8-bit 30B+,
  0.90 otherwise) unless the minimum itself is above it.

Fractions are integer units of 1/10,000 of a card so packing is exact arithmetic. Rules:

* TP "auto" (P16): with an explicit `max_num_seqs`, the smallest valid TP whose want covers
  that concurrency at max_model_len; without one (vLLM's default batch limit is a cap, not a
  demand), for co-located models, or when no TP reaches the concurrency, the smallest TP
  where one request fits. TP never exceeds the GPUs of one node.
* When nothing fits with vLLM's default CUDA-graph capture sizes, the shape retries with
  sizes (1, 2, 4, 8) (P05) before giving up; enforce_eager is never chosen silently (P33).
* max_model_len "auto": the model's maximum when one request of it fits, else the longest
  that fits at the card budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from inferplane.engines.vllm import capture_sizes_from_extra_args
from inferplane.gpus.spec import GIB, GpuSpec
from inferplane.models.profile import ModelProfile
from inferplane.planner import overheads, rules
from inferplane.planner.estimate_types import EngineSettings, MemoryEstimate
from inferplane.planner.kv_cache import kv_dtype_bytes, kv_layout
from inferplane.planner.memory import AUTO_MAX_MODEL_LEN, estimate_memory
from inferplane.planner.weights import DTYPE_BYTES, resolve_dtype, resolve_quantization
from inferplane.spec import ModelSpec

UNITS = 10_000  # one card
SHRUNK_CAPTURE_SIZES = (1, 2, 4, 8)
# Fragmentation/activation-spike headroom on top of the estimate, by weight precision (P06).
HEADROOM_8BIT_BIG = 0.03
HEADROOM_DEFAULT = 0.02
BIG_MODEL_PARAMS = 30_000_000_000
# Kept free inside each instance's share: vLLM's own redundancy buffer in its
# --kv-cache-memory suggestion (gpu_worker.py), so an explicit KV pool never overshoots.
REDUNDANCY_BYTES = 150 * 1024**2


@dataclass(frozen=True)
class GpuType:
    """One GPU model present in the inventory."""

    name: str
    total_bytes: int
    spec: GpuSpec | None
    max_gpus_per_node: int


@dataclass(frozen=True)
class Shape:
    """A model sized on one GPU type."""

    gpu_type: str
    tensor_parallel_size: int
    max_model_len: int
    settings: EngineSettings  # utilization left at 1.0; the plan fills it in
    non_kv_bytes: int  # per GPU, inside the utilization budget
    outside_bytes: int  # per GPU, outside it: CUDA context (+ graphs in older releases)
    kv_bytes_per_request: int  # per GPU, one request at max_model_len
    headroom: float
    min_units: int
    want_units: int
    full_units: int  # what the requested concurrency needs (may exceed the card)
    fixed_utilization: bool  # the user set gpu_memory_utilization
    capture_sizes: tuple[int, ...] | None  # shrunk CUDA-graph sizes the planner chose (P05)
    target_seqs: int
    warnings: tuple[str, ...] = field(default_factory=tuple)
    wider: tuple[int, float] | None = None  # (TP, concurrency) a larger TP would reach

    def outside_units_for(self, total_bytes: int) -> int:
        return math.ceil(self.outside_bytes * UNITS / total_bytes)

    def kv_bytes_at(self, units: int, total_bytes: int) -> int:
        """KV pool per GPU when the instance gets `units` of a card."""
        budget = units * total_bytes // UNITS
        return max(0, int(budget / (1 + self.headroom)) - self.non_kv_bytes)


@dataclass(frozen=True)
class SizingFailure:
    """Why a model has no shape on a GPU type, with the best attempt's numbers."""

    gpu_type: str
    reason: str
    best_tp: int | None
    best_estimate: MemoryEstimate | None


def base_settings(model: ModelSpec, version: str) -> EngineSettings:
    return EngineSettings(
        tensor_parallel_size=1,
        gpu_memory_utilization=1.0,
        max_model_len=None if model.max_model_len == "auto" else model.max_model_len,
        max_num_seqs=model.max_num_seqs,
        max_num_batched_tokens=model.max_num_batched_tokens,
        dtype=model.dtype,
        quantization=model.quantization,
        kv_cache_dtype=model.kv_cache_dtype,
        kv_cache_memory_bytes=(
            int(model.kv_cache_memory_gib * GIB) if model.kv_cache_memory_gib else None
        ),
        enforce_eager=model.enforce_eager,
        vllm_version=version,
    )


def headroom_for(profile: ModelProfile, settings: EngineSettings) -> float:
    quant = resolve_quantization(profile, settings.quantization)
    eight_bit = quant in ("fp8", "modelopt", "fbgemm_fp8", "compressed-tensors")
    if eight_bit and profile.params.total >= BIG_MODEL_PARAMS:
        return HEADROOM_8BIT_BIG
    return HEADROOM_DEFAULT


def safe_band(profile: ModelProfile, settings: EngineSettings) -> float:
    """P06: the highest utilization that stays safe under load for this dtype and size."""
    return 0.85 if headroom_for(profile, settings) == HEADROOM_8BIT_BIG else 0.90


def size_model(
    model: ModelSpec,
    profile: ModelProfile,
    gpu: GpuType,
    *,
    version: str,
    budget_fraction: float,
    settings: EngineSettings | None = None,
    colocated: bool = False,
) -> Shape | SizingFailure:
    """The shape of one replica of `model` on `gpu`, or why there is none. A `colocated`
    model (a colocate_with hint either way) takes the smallest TP where one request fits:
    it shares a card and grows into what is left."""
    base = settings or base_settings(model, version)
    if model.tensor_parallel_size == "auto":
        candidates = rules.valid_tp_sizes(profile, limit=gpu.max_gpus_per_node)
    else:
        candidates = [model.tensor_parallel_size]
    if not candidates:
        return SizingFailure(gpu.name, "no valid tensor-parallel size fits one node", None, None)
    max_len = base.max_model_len
    if max_len is None:  # "auto"
        max_len = _auto_length(profile, base, gpu, candidates, budget_fraction)
    base = replace(base, max_model_len=max_len)
    user_sizes = capture_sizes_from_extra_args(model.extra_args)
    explicit_seqs = model.max_num_seqs is not None and not colocated
    fixed_util = model.gpu_memory_utilization != "auto"

    fitting: list[Shape] = []
    best: SizingFailure | None = None
    for shrink in (False, True):
        if shrink and (user_sizes is not None or base.enforce_eager):
            break
        for tp in candidates:
            result = _shape_at(
                model, profile, gpu, replace(base, tensor_parallel_size=tp),
                budget_fraction=budget_fraction,
                capture_sizes=_shrunk_sizes(base) if shrink else None,
                user_sizes=user_sizes,
                fixed_util=fixed_util,
            )
            if isinstance(result, SizingFailure):
                if best is None or (result.best_estimate and best.best_estimate and
                                    result.best_estimate.kv_cache_gib
                                    > best.best_estimate.kv_cache_gib):
                    best = result
                continue
            fitting.append(result)
            if not explicit_seqs or _meets_target(result):
                return result
        if fitting:
            break
    if fitting:
        # No TP meets the requested concurrency: the smallest that fits one request (P16);
        # more GPUs would not reach the target either. Say what the largest TP would hold.
        chosen = fitting[0]
        widest = fitting[-1]
        if widest is chosen:
            return chosen
        return replace(
            chosen, wider=(widest.tensor_parallel_size, _concurrency(widest, gpu.total_bytes))
        )
    assert best is not None
    return best


def _meets_target(shape: Shape) -> bool:
    return shape.want_units >= shape.full_units or shape.fixed_utilization


def _concurrency(shape: Shape, total_bytes: int) -> float:
    if not shape.kv_bytes_per_request:
        return 0.0
    return shape.kv_bytes_at(shape.want_units, total_bytes) / shape.kv_bytes_per_request


def _units_for(need_bytes: int, headroom: float, total_bytes: int) -> int:
    return math.ceil(need_bytes * (1 + headroom) * UNITS / total_bytes)


def _shrunk_sizes(settings: EngineSettings) -> tuple[int, ...]:
    seqs = settings.max_num_seqs or 256
    return tuple(s for s in SHRUNK_CAPTURE_SIZES if s <= seqs) or (1,)


def _graph_bytes(profile: ModelProfile, sizes: list[int] | tuple[int, ...]) -> int:
    return (
        overheads.CUDA_GRAPH_BASE_BYTES
        + len(sizes) * profile.num_layers * overheads.CUDA_GRAPH_BYTES_PER_SIZE_LAYER
    )


def _shape_at(
    model: ModelSpec,
    profile: ModelProfile,
    gpu: GpuType,
    settings: EngineSettings,
    *,
    budget_fraction: float,
    capture_sizes: tuple[int, ...] | None,
    user_sizes: list[int] | None,
    fixed_util: bool,
) -> Shape | SizingFailure:
    tp = settings.tensor_parallel_size
    probe = replace(settings, kv_cache_memory_bytes=None, gpu_memory_utilization=1.0)
    est = estimate_memory(profile, probe, gpu=gpu.spec, gpu_memory_bytes=gpu.total_bytes)
    if est.errors and est.kv_cache_gib <= 0:
        return SizingFailure(gpu.name, est.errors[0], tp, est)
    hard = [e for e in est.errors if not e.startswith("P02")]
    if hard:
        return SizingFailure(gpu.name, hard[0], tp, est)
    graph = int(est.cuda_graph_gib * GIB)
    sizes = capture_sizes or (tuple(user_sizes) if user_sizes is not None else None)
    if sizes is not None and not settings.enforce_eager:
        graph = _graph_bytes(profile, sizes)
    weights = int(est.weights_gib * GIB)
    in_budget = weights + int(est.activation_gib * GIB) + int(est.non_torch_gib * GIB)
    outside = overheads.CUDA_CONTEXT_BYTES
    if est.cuda_graph_in_budget:
        in_budget += graph
    else:
        outside += graph
    in_budget += REDUNDANCY_BYTES
    dtype = resolve_dtype(profile, settings.dtype)
    layout = kv_layout(
        profile, tp, kv_dtype_bytes(settings.kv_cache_dtype, DTYPE_BYTES[dtype]), est.block_size
    )
    assert settings.max_model_len is not None
    per_request = layout.bytes_per_request(settings.max_model_len, est.max_num_batched_tokens)
    headroom = headroom_for(profile, settings)
    total = gpu.total_bytes
    cap = int(budget_fraction * UNITS) - math.ceil(outside * UNITS / total)
    target = settings.max_num_seqs or est.max_num_seqs
    if settings.kv_cache_memory_bytes is not None:  # the user fixed the KV pool
        minimum = want = full = _units_for(
            in_budget + settings.kv_cache_memory_bytes, headroom, total
        )
    else:
        minimum = _units_for(in_budget + per_request + layout.page_bytes, headroom, total)
        full = _units_for(in_budget + target * per_request, headroom, total)
        band = int(safe_band(profile, settings) * UNITS)
        want = max(minimum, min(full, band, cap))
    if fixed_util:
        assert model.gpu_memory_utilization != "auto"
        explicit = round(float(model.gpu_memory_utilization) * UNITS)
        if explicit < minimum:
            return SizingFailure(
                gpu.name,
                f"gpu_memory_utilization {model.gpu_memory_utilization} leaves no room for one "
                f"{settings.max_model_len}-token request at TP {tp} (needs "
                f"{minimum / UNITS:.3f})",
                tp, est,
            )
        minimum = want = explicit
    if minimum > cap:
        return SizingFailure(
            gpu.name,
            f"needs {minimum / UNITS:.3f} of each {gpu.name} at TP {tp} (one "
            f"{settings.max_model_len}-token request) but the card budget leaves "
            f"{cap / UNITS:.3f}",
            tp, est,
        )
    warnings: list[str] = []
    if capture_sizes is not None:
        warnings.append(
            f"P05: {model.name}: CUDA-graph capture sizes shrunk to {list(capture_sizes)} "
            f"so it fits {gpu.name} at TP {tp}"
        )
    return Shape(
        gpu_type=gpu.name,
        tensor_parallel_size=tp,
        max_model_len=settings.max_model_len,
        settings=settings,
        non_kv_bytes=in_budget,
        outside_bytes=outside,
        kv_bytes_per_request=per_request,
        headroom=headroom,
        min_units=minimum,
        want_units=want,
        full_units=full,
        fixed_utilization=fixed_util,
        capture_sizes=capture_sizes,
        target_seqs=target,
        warnings=tuple(warnings),
    )


def _auto_length(
    profile: ModelProfile,
    base: EngineSettings,
    gpu: GpuType,
    candidates: list[int],
    budget_fraction: float,
) -> int:
    """max_model_len "auto": the model's maximum if one request fits some TP, else the
    longest that fits at the budget (at least 1 token; sizing then reports the failure)."""
    best = 0
    util = max(0.05, budget_fraction - overheads.CUDA_CONTEXT_BYTES / gpu.total_bytes)
    for tp in candidates:
        probe = replace(
            base, tensor_parallel_size=tp, max_model_len=AUTO_MAX_MODEL_LEN,
            gpu_memory_utilization=round(util, 4), kv_cache_memory_bytes=None,
        )
        est = estimate_memory(profile, probe, gpu=gpu.spec, gpu_memory_bytes=gpu.total_bytes)
        if est.max_model_len >= profile.max_position_embeddings:
            return profile.max_position_embeddings
        best = max(best, est.max_model_len)
    return max(best, 1)
