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
* pipeline_parallel_size (replicas that span nodes): an explicit N sizes every stage - one
  node with TP GPUs each, holding ~1/N of the layers (`inferplane.estimator.pipeline`) - and
  the shape's numbers are the heaviest stage's (one utilization for all stages); "auto"
  tries 1 first and N = 2, 3, ... (nodes of the GPU type) only when nothing fits one node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from inferplane.engines.vllm import capture_sizes_from_extra_args
from inferplane.estimator import overheads, rules
from inferplane.estimator.kv_cache import kv_dtype_bytes, kv_layout
from inferplane.estimator.memory import AUTO_MAX_MODEL_LEN, estimate_memory
from inferplane.estimator.pipeline import (
    PP_PARTITION_ENV,
    Stage,
    parse_partition,
    stage_profile,
    stages,
)
from inferplane.estimator.types import EngineSettings, MemoryEstimate
from inferplane.estimator.weights import DTYPE_BYTES, resolve_dtype, resolve_quantization
from inferplane.gpus.spec import GIB, GpuSpec
from inferplane.models.profile import ModelProfile
from inferplane.planner.lora import lora_slots
from inferplane.spec import ModelSpec

UNITS = 10_000  # one card
SHARE_STEPS = 4  # card shares tried between a replica's minimum and its want
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
    node_gpu_counts: tuple[int, ...] = ()  # GPUs of this type on each node; () = unknown

    def nodes_with(self, gpus: int) -> int:
        """Nodes with at least `gpus` GPUs of this type (1 when the inventory is unknown)."""
        if not self.node_gpu_counts:
            return 1 if gpus <= self.max_gpus_per_node else 0
        return sum(1 for count in self.node_gpu_counts if count >= gpus)


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
    # Nodes per replica (pipeline stages); the byte and unit figures above are then per GPU
    # of the heaviest stage. `pipeline_layers`: decoder layers per stage (empty for one).
    pipeline_parallel_size: int = 1
    pipeline_layers: tuple[int, ...] = ()
    # The user asked for `max_num_seqs` concurrent requests: a demand the planner tries to
    # meet (a larger TP may be needed). vLLM's default is a cap, not a demand: then the
    # demand is this shape's `want` (the safe band), which TP cannot raise.
    explicit_seqs: bool = False
    # The model shares GPUs by design (colocate_with, either side). Without an explicit
    # max_num_seqs it then asks for no more than one request's room: the want of a card
    # of its own is no demand on a card it is meant to share.
    colocated: bool = False

    @property
    def demand_units(self) -> int:
        """The card share at which this replica meets its demand (may exceed the card)."""
        if self.fixed_utilization:
            return self.want_units
        if not self.explicit_seqs:
            return self.min_units if self.colocated else self.want_units
        return self.full_units

    def meets(self, units: int) -> bool:
        """Whether `units` of each card meet the replica's demand (its requested
        concurrency at max_model_len, or the want of an explicit utilization/KV pool)."""
        return units >= self.demand_units

    def share_steps(self) -> tuple[int, ...]:
        """The card shares placement may pack this replica at, largest first: its want, a
        few steps down, and its minimum (one request). Fixed by the user: that one."""
        if self.fixed_utilization or self.want_units <= self.min_units:
            return (self.want_units,)
        span = self.want_units - self.min_units
        steps = {self.want_units, self.min_units}
        steps.update(self.min_units + span * k // SHARE_STEPS for k in range(1, SHARE_STEPS))
        return tuple(sorted(steps, reverse=True))

    def concurrency_at(self, units: int, total_bytes: int) -> float:
        """Requests of max_model_len the KV pool holds at `units` of each card."""
        if not self.kv_bytes_per_request:
            return 0.0
        return self.kv_bytes_at(units, total_bytes) / self.kv_bytes_per_request

    def held_permille(self, units: int, total_bytes: int) -> int:
        """How much of its demand a replica holds at `units`, in 1/1,000 (1,000 = met)."""
        if self.meets(units):
            return 1000
        if not self.kv_bytes_per_request:
            return 0
        demand = self.kv_bytes_at(self.demand_units, total_bytes)
        if demand <= 0:
            return 1000
        return min(1000, self.kv_bytes_at(units, total_bytes) * 1000 // demand)

    @property
    def gpus(self) -> int:
        """GPUs one replica takes, over all its nodes."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

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
    best_pp: int = 1


def base_settings(model: ModelSpec, version: str) -> EngineSettings:
    return EngineSettings(
        tensor_parallel_size=1,
        pipeline_parallel_size=(
            model.pipeline_parallel_size if isinstance(model.pipeline_parallel_size, int) else 1
        ),
        pipeline_layer_partition=parse_partition(model.env.get(PP_PARTITION_ENV)),
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
        lora=lora_slots(model),
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
) -> Shape | SizingFailure:
    """The preferred shape of one replica of `model` on `gpu` alone (P16: the smallest TP
    that meets the requested concurrency, else the smallest where one request fits), or
    why there is none. The planner itself weighs every candidate (`candidate_shapes`)."""
    result = candidate_shapes(model, profile, gpu, version=version,
                              budget_fraction=budget_fraction, settings=settings)
    if isinstance(result, SizingFailure):
        return result
    return preferred(result, gpu.total_bytes)


def preferred(fitting: list[Shape], total_bytes: int) -> Shape:
    """The shape a replica alone would take: the smallest TP meeting its demand, else the
    smallest TP (saying what the widest would hold)."""
    for shape in fitting:
        if shape.meets(shape.want_units):
            return shape
    chosen, widest = fitting[0], fitting[-1]
    if widest is chosen:
        return chosen
    return replace(
        chosen, wider=(widest.tensor_parallel_size,
                       widest.concurrency_at(widest.want_units, total_bytes))
    )


def candidate_shapes(
    model: ModelSpec,
    profile: ModelProfile,
    gpu: GpuType,
    *,
    version: str,
    budget_fraction: float,
    settings: EngineSettings | None = None,
) -> list[Shape] | SizingFailure:
    """Every shape one replica of `model` may take on `gpu` - each valid TP where one
    request fits, smallest first - or why there is none. Pipeline stages: one shape, the
    fewest stages that fit (see the module doc)."""
    base = settings or base_settings(model, version)
    best: SizingFailure | None = None
    for pp in _pipeline_options(model, profile, gpu, base):
        result = _size_at(
            model, profile, gpu, replace(base, pipeline_parallel_size=pp),
            budget_fraction=budget_fraction,
        )
        if isinstance(result, list):
            if pp > 1:  # a replica that spans nodes takes the shape alone would take
                return [preferred(result, gpu.total_bytes)]
            return result
        if best is None or _better_failure(result, best):
            best = result
    assert best is not None
    return best


def _pipeline_options(
    model: ModelSpec, profile: ModelProfile, gpu: GpuType, base: EngineSettings
) -> list[int]:
    """Explicit: that size. auto: 1, then 2, 3, ... up to the nodes of this GPU type (never
    for a model pinned to a node or sharing GPUs)."""
    if model.pipeline_parallel_size != "auto":
        return [base.pipeline_parallel_size]
    if model.placement.node is not None or model.placement.colocate_with:
        return [1]
    most = min(gpu.nodes_with(1), profile.num_layers)
    return list(range(1, max(1, most) + 1))


def _better_failure(new: SizingFailure, old: SizingFailure) -> bool:
    if new.best_estimate is None or old.best_estimate is None:
        return old.best_estimate is None and new.best_estimate is not None
    return new.best_estimate.kv_cache_gib > old.best_estimate.kv_cache_gib


def _size_at(
    model: ModelSpec,
    profile: ModelProfile,
    gpu: GpuType,
    base: EngineSettings,
    *,
    budget_fraction: float,
) -> list[Shape] | SizingFailure:
    """Every fitting shape at `base.pipeline_parallel_size` stages, smallest TP first."""
    pp = base.pipeline_parallel_size
    if pp > 1 or base.pipeline_layer_partition is not None:
        problem = _pipeline_problem(profile, pp, base)
        if problem is not None:
            return SizingFailure(gpu.name, problem, None, None, pp)
    if model.tensor_parallel_size == "auto":
        candidates = rules.valid_tp_sizes(profile, limit=gpu.max_gpus_per_node)
    else:
        candidates = [model.tensor_parallel_size]
        if model.tensor_parallel_size > gpu.max_gpus_per_node:  # a TP group is one node's
            return SizingFailure(
                gpu.name,
                f"tensor_parallel_size {model.tensor_parallel_size} needs "
                f"{model.tensor_parallel_size} {gpu.name} GPUs on one node; the largest "
                f"{gpu.name} node has {gpu.max_gpus_per_node}",
                None, None, pp,
            )
    if pp > 1:
        candidates = [tp for tp in candidates if gpu.nodes_with(tp) >= pp]
        if not candidates:
            tp = model.tensor_parallel_size if isinstance(model.tensor_parallel_size, int) else 1
            return SizingFailure(
                gpu.name,
                f"pipeline_parallel_size {pp} needs {pp} nodes with {tp} {gpu.name} GPU(s) "
                f"each; {gpu.nodes_with(tp)} of the inventory's {gpu.nodes_with(1)} "
                f"{gpu.name} node(s) have them",
                None, None, pp,
            )
    if not candidates:
        return SizingFailure(gpu.name, "no valid tensor-parallel size fits one node", None, None)
    max_len = base.max_model_len
    if max_len is None:  # "auto"
        max_len = _auto_length(profile, base, gpu, candidates, budget_fraction)
    base = replace(base, max_model_len=max_len)
    user_sizes = capture_sizes_from_extra_args(model.extra_args)
    fixed_util = model.gpu_memory_utilization != "auto"

    best: SizingFailure | None = None
    for shrink in (False, True):
        if shrink and (user_sizes is not None or base.enforce_eager):
            break
        fitting: list[Shape] = []
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
        if fitting:
            return fitting
    assert best is not None
    return best


def _pipeline_problem(profile: ModelProfile, pp: int, settings: EngineSettings) -> str | None:
    errors = rules.pipeline_parallel_errors(profile, pp, settings.pipeline_layer_partition)
    return errors[0] if errors else None


def _units_for(need_bytes: int, headroom: float, total_bytes: int) -> int:
    return math.ceil(need_bytes * (1 + headroom) * UNITS / total_bytes)


def _shrunk_sizes(settings: EngineSettings) -> tuple[int, ...]:
    seqs = settings.max_num_seqs or 256
    return tuple(s for s in SHRUNK_CAPTURE_SIZES if s <= seqs) or (1,)


def graph_bytes(profile: ModelProfile, sizes: list[int] | tuple[int, ...]) -> int:
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
    pp = settings.pipeline_parallel_size
    at = f"TP {tp}" + (f" on each of {pp} nodes" if pp > 1 else "")
    probe = replace(settings, kv_cache_memory_bytes=None, gpu_memory_utilization=1.0)
    est = estimate_memory(profile, probe, gpu=gpu.spec, gpu_memory_bytes=gpu.total_bytes)
    if est.errors and est.kv_cache_gib <= 0:
        return SizingFailure(gpu.name, est.errors[0], tp, est, pp)
    hard = [e for e in est.errors if not e.startswith("P02")]
    if hard:
        return SizingFailure(gpu.name, hard[0], tp, est, pp)
    sizes = capture_sizes or (tuple(user_sizes) if user_sizes is not None else None)
    assert settings.max_model_len is not None
    needs = _stage_needs(profile, settings, est, sizes)
    in_budget = max(need.in_budget for need in needs)
    outside = max(need.outside for need in needs)
    per_request = max(need.per_request for need in needs)
    headroom = headroom_for(profile, settings)
    total = gpu.total_bytes
    cap = int(budget_fraction * UNITS) - math.ceil(outside * UNITS / total)
    target = settings.max_num_seqs or est.max_num_seqs
    if settings.kv_cache_memory_bytes is not None:  # the user fixed the KV pool
        minimum = want = full = _units_for(
            in_budget + settings.kv_cache_memory_bytes, headroom, total
        )
    else:
        minimum = max(
            _units_for(need.in_budget + need.per_request + need.page_bytes, headroom, total)
            for need in needs
        )
        full = max(
            _units_for(need.in_budget + target * need.per_request, headroom, total)
            for need in needs
        )
        band = int(safe_band(profile, settings) * UNITS)
        want = max(minimum, min(full, band, cap))
    if fixed_util:
        assert model.gpu_memory_utilization != "auto"
        explicit = round(float(model.gpu_memory_utilization) * UNITS)
        if explicit < minimum:
            return SizingFailure(
                gpu.name,
                f"gpu_memory_utilization {model.gpu_memory_utilization} leaves no room for one "
                f"{settings.max_model_len}-token request at {at} (needs "
                f"{minimum / UNITS:.3f})",
                tp, est, pp,
            )
        minimum = want = explicit
    if minimum > cap:
        return SizingFailure(
            gpu.name,
            f"needs {minimum / UNITS:.3f} of each {gpu.name} at {at} (one "
            f"{settings.max_model_len}-token request) but the card budget leaves "
            f"{cap / UNITS:.3f}",
            tp, est, pp,
        )
    warnings: list[str] = []
    if capture_sizes is not None:
        warnings.append(
            f"P05: {model.name}: CUDA-graph capture sizes shrunk to {list(capture_sizes)} "
            f"so it fits {gpu.name} at {at}"
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
        explicit_seqs=settings.max_num_seqs is not None,
        capture_sizes=capture_sizes,
        target_seqs=target,
        warnings=tuple(warnings),
        pipeline_parallel_size=pp,
        pipeline_layers=(
            tuple(s.num_layers for s in _stages_of(profile, settings)) if pp > 1 else ()
        ),
    )


@dataclass(frozen=True)
class _StageNeed:
    """Per GPU of one pipeline stage (the whole model when PP is 1)."""

    in_budget: int  # inside the utilization budget, besides the KV cache
    outside: int  # CUDA context (+ graphs before 0.21)
    per_request: int  # KV of one request at max_model_len
    page_bytes: int


def _stages_of(profile: ModelProfile, settings: EngineSettings) -> list[Stage]:
    return stages(profile.num_layers, settings.pipeline_parallel_size,
                  settings.pipeline_layer_partition)


def _stage_needs(
    profile: ModelProfile,
    settings: EngineSettings,
    est: MemoryEstimate,
    sizes: tuple[int, ...] | None,
) -> list[_StageNeed]:
    figures: list[tuple[ModelProfile, float, float, float, float]]
    if est.ranks:  # the LoRA slots sit with the weights: loaded with them, never freed
        figures = [
            (stage_profile(profile, stage), r.weights_gib + r.lora_gib, r.activation_gib,
             r.non_torch_gib, r.cuda_graph_gib)
            for stage, r in zip(_stages_of(profile, settings), est.ranks, strict=True)
        ]
    else:
        figures = [(profile, est.weights_gib + est.lora_gib, est.activation_gib,
                    est.non_torch_gib, est.cuda_graph_gib)]
    dtype = resolve_dtype(profile, settings.dtype)
    kv_bytes = kv_dtype_bytes(settings.kv_cache_dtype, DTYPE_BYTES[dtype])
    assert settings.max_model_len is not None
    needs: list[_StageNeed] = []
    for part, weights_gib, activation_gib, non_torch_gib, graph_gib in figures:
        graph = int(graph_gib * GIB)
        if sizes is not None and not settings.enforce_eager:
            graph = graph_bytes(part, sizes)
        weights = int(weights_gib * GIB)
        in_budget = weights + int(activation_gib * GIB) + int(non_torch_gib * GIB)
        outside = overheads.CUDA_CONTEXT_BYTES
        if est.cuda_graph_in_budget:
            in_budget += graph
        else:
            outside += graph
        in_budget += REDUNDANCY_BYTES
        layout = kv_layout(part, settings.tensor_parallel_size, kv_bytes, est.block_size)
        per_request = layout.bytes_per_request(
            settings.max_model_len, est.max_num_batched_tokens
        )
        needs.append(_StageNeed(in_budget, outside, per_request, layout.page_bytes))
    return needs


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
