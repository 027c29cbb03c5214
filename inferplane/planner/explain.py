"""When a fleet does not fit: which model, the best the planner got, and what would fit.

Every suggestion is checked by sizing the model again with the change applied, so the
numbers it quotes (a length, a TP size, a GPU) are ones the planner would accept.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from inferplane.errors import InferplaneError
from inferplane.gpus import known_gpus
from inferplane.models.profile import ModelProfile
from inferplane.planner import overheads
from inferplane.planner.estimate_types import EngineSettings
from inferplane.planner.memory import AUTO_MAX_MODEL_LEN, estimate_memory
from inferplane.planner.placement import Item, Placement, Slot
from inferplane.planner.sizing import GpuType, Shape, SizingFailure, base_settings, size_model
from inferplane.spec import ModelSpec


def unsized(
    model: ModelSpec,
    profile: ModelProfile,
    failures: list[SizingFailure],
    types: list[GpuType],
    *,
    version: str,
    budget_fraction: float,
) -> InferplaneError:
    """No GPU type of the inventory can hold one replica of `model`."""
    best = _best_failure(failures)
    allowed = [t for t in types if t.name in {f.gpu_type for f in failures}] or types
    fixes = suggestions(model, profile, allowed, version=version, budget_fraction=budget_fraction)
    got = f"best attempt: {best.gpu_type}"
    if best.best_tp is not None:
        got += f" at TP {best.best_tp}"
        if best.best_pp > 1:
            got += f" on each of {best.best_pp} nodes"
    if best.best_estimate is not None:
        got += (
            f" ({best.best_estimate.weights_gib:.1f} GiB of weights per GPU of "
            f"{best.best_estimate.total_memory_gib:.1f} GiB)"
        )
    return InferplaneError(
        f"{model.name} does not fit any GPU of the inventory: {best.reason}; {got}",
        field=f"models.{model.name}",
        value=model.source,
        fix="; or ".join(fixes) if fixes else "use larger GPUs",
    )


def unplaced(
    placement: Placement, items: list[Item], models: list[ModelSpec], slots: list[Slot]
) -> InferplaneError:
    """Every model fits a GPU alone, but not all replicas fit the inventory at once (P08)."""
    by_id = {i.id: i for i in items}
    missing = Counter(by_id[i].model for i in placement.unplaced)
    name = min(missing, key=lambda m: next(i.order for i in items if i.model == m))
    item = next(by_id[i] for i in placement.unplaced if by_id[i].model == name)
    model = next(m for m in models if m.name == name)
    placed = model.replicas - missing[name]
    shape = min((s for shapes in item.shapes.values() for s in shapes),
                key=lambda s: (s.gpus, s.min_units, s.gpu_type))
    if shape.pipeline_parallel_size > 1:
        return _unplaced_spanning(placement, by_id, model, placed, shape, slots)
    free = _free_gpus(placement, slots, set(item.shapes))
    need_gpus = shape.tensor_parallel_size * missing[name]
    message = (
        f"{name}: placed {placed} of {model.replicas} replicas; the rest do not fit next to "
        f"the other models (P08). Each replica needs TP {shape.tensor_parallel_size} on one "
        f"node of {', '.join(sorted(item.shapes))} with at least {shape.min_units / 100:.1f}% "
        f"of each card; {free} such GPUs are still free"
    )
    if item.exclusive:
        message += " (exclusive: it needs GPUs nothing else uses)"
    if item.colocate_with:
        message += f" (it must share a GPU with {', '.join(item.colocate_with)})"
    fixes = [f"replicas: {placed} for {name}" if placed else f"remove {name}"]
    fixes.append(
        f"add {need_gpus} {shape.gpu_type} GPUs"
        + (f" ({shape.tensor_parallel_size} per node)" if shape.tensor_parallel_size > 1 else "")
    )
    if item.colocate_with:
        fixes.append(f"more replicas of {', '.join(item.colocate_with)} to share cards with")
    return InferplaneError(
        message, field=f"models.{name}.replicas", value=model.replicas, fix="; or ".join(fixes)
    )


def _unplaced_spanning(
    placement: Placement,
    by_id: dict[str, Item],
    model: ModelSpec,
    placed: int,
    shape: Shape,
    slots: list[Slot],
) -> InferplaneError:
    """A replica that spans nodes needs `pp` nodes, each with TP GPUs nothing else uses."""
    pp, tp, gpu = shape.pipeline_parallel_size, shape.tensor_parallel_size, shape.gpu_type
    missing = sum(1 for i in placement.unplaced if by_id[i].model == model.name)
    nodes = _nodes_with_free(placement, slots, gpu, tp)
    message = (
        f"{model.name}: placed {placed} of {model.replicas} replicas. Each replica spans {pp} "
        f"nodes (pipeline_parallel_size {pp}, layers {list(shape.pipeline_layers)}) and "
        f"needs {pp} nodes with {tp} free {gpu} GPU(s) each (TP {tp} per node; GPUs of a "
        f"replica that spans nodes hold nothing else); {nodes} node(s) have them"
    )
    short = max(1, missing * pp - nodes)
    fixes = [f"replicas: {placed} for {model.name}" if placed else f"remove {model.name}"]
    fixes.append(f"add {short} {gpu} node(s) with {tp} GPU(s) each")
    if model.pipeline_parallel_size == "auto":
        fixes.append("larger nodes, so one node holds a replica")
    return InferplaneError(
        message, field=f"models.{model.name}.replicas", value=model.replicas,
        fix="; or ".join(fixes),
    )


def _nodes_with_free(placement: Placement, slots: list[Slot], gpu: str, tp: int) -> int:
    used = {key for c in placement.choices.values() for key in c.gpus()}
    free: Counter[str] = Counter(s.node for s in slots if s.gpu_type == gpu and s.key not in used)
    return sum(1 for count in free.values() if count >= tp)


def suggestions(
    model: ModelSpec,
    profile: ModelProfile,
    types: list[GpuType],
    *,
    version: str,
    budget_fraction: float,
) -> list[str]:
    """Changes that make one replica fit, each verified by sizing again."""
    out: list[str] = []
    base = base_settings(model, version)
    biggest = max(types, key=lambda t: (t.total_bytes, t.name))
    length = _longest_length(profile, base, biggest, budget_fraction)
    for _ in range(4):  # the auto-fit ignores headroom: shorten until the planner accepts it
        if not length or not base.max_model_len or length >= base.max_model_len:
            break
        if _try(model, profile, [biggest], replace(base, max_model_len=length), version,
                budget_fraction) is not None:
            out.append(
                f"max_model_len: {length} (the longest one request fits on {biggest.name})"
            )
            break
        length = int(length * 0.95) // 16 * 16
    changes: list[tuple[str, EngineSettings]] = []
    if model.kv_cache_dtype == "auto":
        changes.append(("kv_cache_dtype: fp8 (halves the KV cache)",
                        replace(base, kv_cache_dtype="fp8")))
    if profile.quantization is None and model.quantization is None:
        changes.append(("quantization: fp8 (halves the weights)",
                        replace(base, quantization="fp8")))
        if model.kv_cache_dtype == "auto":
            changes.append(("quantization: fp8 and kv_cache_dtype: fp8",
                            replace(base, quantization="fp8", kv_cache_dtype="fp8")))
    for label, settings in changes:
        shape = _try(model, profile, types, settings, version, budget_fraction)
        if shape is not None:
            out.append(f"{label}: then TP {shape.tensor_parallel_size} on {shape.gpu_type} fits")
    out += _pipeline_suggestions(model, profile, types, base, version, budget_fraction)
    if biggest.max_gpus_per_node < 8 and model.tensor_parallel_size == "auto":
        wider = replace(biggest, max_gpus_per_node=8)
        result = size_model(model, profile, wider, version=version, budget_fraction=budget_fraction)
        if isinstance(result, Shape):
            out.append(
                f"{result.tensor_parallel_size} {biggest.name} GPUs on one node "
                f"(TP {result.tensor_parallel_size})"
            )
    larger = _larger_gpu(model, profile, biggest, version, budget_fraction)
    if larger:
        out.append(larger)
    return out


def _pipeline_suggestions(
    model: ModelSpec,
    profile: ModelProfile,
    types: list[GpuType],
    base: EngineSettings,
    version: str,
    budget_fraction: float,
) -> list[str]:
    """Spanning nodes (pipeline stages), when the model is kept on one node and the
    inventory has several nodes of a type: the fewest stages that fit."""
    if model.pipeline_parallel_size != 1 or model.placement.node is not None:
        return []
    if model.placement.colocate_with:
        return []
    most = max((t.nodes_with(1) for t in types), default=1)
    for pp in range(2, min(most, profile.num_layers) + 1):
        eligible = [t for t in types if t.nodes_with(1) >= pp]
        shape = _try(model, profile, eligible, replace(base, pipeline_parallel_size=pp),
                     version, budget_fraction)
        if shape is not None:
            return [
                f"pipeline_parallel_size: {pp} (or auto): then TP {shape.tensor_parallel_size} "
                f"on each of {pp} {shape.gpu_type} nodes fits (a replica that spans nodes; "
                "deploy it with `inferplane render --target k8s|systemd`)"
            ]
    return []


def _try(
    model: ModelSpec,
    profile: ModelProfile,
    types: list[GpuType],
    settings: EngineSettings,
    version: str,
    budget_fraction: float,
) -> Shape | None:
    for gpu in sorted(types, key=lambda t: (t.total_bytes, t.name)):
        result = size_model(model, profile, gpu, version=version,
                            budget_fraction=budget_fraction, settings=settings)
        if isinstance(result, Shape):
            return result
    return None


def _larger_gpu(
    model: ModelSpec, profile: ModelProfile, current: GpuType, version: str, budget: float
) -> str | None:
    for spec in sorted(known_gpus(), key=lambda g: (g.total_memory_bytes, g.name)):
        if spec.total_memory_bytes < 1.15 * current.total_bytes:
            continue
        gpu = GpuType(spec.name, spec.total_memory_bytes, spec, current.max_gpus_per_node)
        result = size_model(model, profile, gpu, version=version, budget_fraction=budget)
        if isinstance(result, Shape):
            return (
                f"a larger GPU: {spec.name} ({spec.total_memory_gib:.0f} GiB) fits it at TP "
                f"{result.tensor_parallel_size}"
            )
    return None


def _longest_length(
    profile: ModelProfile, base: EngineSettings, gpu: GpuType, budget: float
) -> int:
    util = round(budget - overheads.CUDA_CONTEXT_BYTES / gpu.total_bytes, 4)
    best = 0
    for tp in (1, 2, 4, 8):
        if tp > gpu.max_gpus_per_node:
            break
        settings = replace(base, tensor_parallel_size=tp, max_model_len=AUTO_MAX_MODEL_LEN,
                           gpu_memory_utilization=util, kv_cache_memory_bytes=None)
        est = estimate_memory(profile, settings, gpu=gpu.spec, gpu_memory_bytes=gpu.total_bytes)
        if not any("P11" in e for e in est.errors):
            best = max(best, est.max_model_len)
    return best


def _best_failure(failures: list[SizingFailure]) -> SizingFailure:
    def key(f: SizingFailure) -> float:
        return f.best_estimate.kv_cache_gib - f.best_estimate.weights_gib if f.best_estimate \
            else float("-inf")

    return max(failures, key=key)


def _free_gpus(placement: Placement, slots: list[Slot], types: set[str]) -> int:
    used = {key for c in placement.choices.values() for key in c.gpus()}
    return sum(1 for s in slots if s.gpu_type in types and s.key not in used)
