"""When a fleet does not fit: which model, the best the planner got, and what would fit.

Each suggestion is a `Fix`: its text and the fleet change it describes. Candidates are
found by sizing the model again with a change applied; the planner then plans the whole
fleet with each one (`fixes.verified`) and prints only those that plan, so every number it
quotes (a length, a TP size, GPUs to add on a named node) is one it accepts.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from inferplane.estimator import overheads
from inferplane.estimator.memory import AUTO_MAX_MODEL_LEN, estimate_memory
from inferplane.estimator.types import EngineSettings
from inferplane.gpus import known_gpus
from inferplane.models.profile import ModelProfile
from inferplane.planner.fixes import (
    Fix,
    PlanRefused,
    with_model,
    with_new_node,
    with_node,
    without_model,
)
from inferplane.planner.placement import Item, Placement, Slot
from inferplane.planner.sizing import GpuType, Shape, SizingFailure, base_settings, size_model
from inferplane.spec import FleetSpec, ModelSpec
from inferplane.spec.inventory import NodeSpec


@dataclass
class Refusal:
    """What the planner could not do, and candidate fixes (checked before printing)."""

    message: str
    field: str
    value: Any
    fixes: list[Fix] = dataclasses.field(default_factory=list)
    fallback: str = "use larger GPUs"

    def error(self, verified: list[Fix]) -> PlanRefused:
        return PlanRefused(self.message, field=self.field, value=self.value, fixes=verified,
                           fallback=self.fallback)


def unsized(
    model: ModelSpec,
    profile: ModelProfile,
    failures: list[SizingFailure],
    types: list[GpuType],
    fleet: FleetSpec,
    *,
    version: str,
    budget_fraction: float,
) -> Refusal:
    """No GPU type of the inventory can hold one replica of `model`."""
    best = _best_failure(failures)
    allowed = [t for t in types if t.name in {f.gpu_type for f in failures}] or types
    fixes = suggestions(model, profile, allowed, fleet, version=version,
                        budget_fraction=budget_fraction)
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
    if best.best_tp is None and best.best_estimate is None:  # refused before sizing
        field, value = f"models.{model.name}", model.source
        value_any: object = value
        if best.reason.startswith("tensor_parallel_size"):
            field = f"models.{model.name}.tensor_parallel_size"
            value_any = model.tensor_parallel_size
        return Refusal(f"{model.name} does not fit any GPU of the inventory: {best.reason}",
                       field=field, value=value_any, fixes=fixes)
    return Refusal(
        f"{model.name} does not fit any GPU of the inventory: {best.reason}; {got}",
        field=f"models.{model.name}", value=model.source, fixes=fixes,
    )


def unplaced(
    placement: Placement,
    items: list[Item],
    models: list[ModelSpec],
    slots: list[Slot],
    fleet: FleetSpec,
) -> Refusal:
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
        return _unplaced_spanning(placement, by_id, model, placed, shape, slots, fleet)
    roomy = _gpus_with_room(placement, by_id, slots, shape, item)
    tp = shape.tensor_parallel_size
    why = ("its gpu_memory_utilization" if shape.fixed_utilization
           else f"one {shape.max_model_len}-token request")
    message = (
        f"{name}: placed {placed} of {model.replicas} replicas; the rest do not fit next to "
        f"the other models (P08). The smallest way to run one: TP {tp} on one node of "
        f"{shape.gpu_type} at {shape.min_units / 100:.1f}% of each card ({why}) plus its "
        f"CUDA context; after placing the others, {roomy} {shape.gpu_type} GPU(s) it may "
        "use have that much room"
    )
    if item.exclusive:
        message += " (exclusive: it needs GPUs nothing else uses)"
    if item.colocate_with:
        message += f" (it must share a GPU with {', '.join(item.colocate_with)})"
    fixes = [Fix(f"replicas: {placed} for {name}", with_model(name, replicas=placed))
             if placed else Fix(f"remove {name}", without_model(name))]
    fixes += _pin_fixes(model)
    fixes += [Fix(f"drop placement.exclusive of {m.name}",
                  with_model(m.name, placement={"exclusive": False}))
              for m in models if m.placement.exclusive and m.name != name]
    if isinstance(model.max_model_len, int) and model.max_model_len > 2048:
        half = model.max_model_len // 2
        fixes.append(Fix(f"max_model_len: {half} for {name}", with_model(name, max_model_len=half)))
    if isinstance(model.tensor_parallel_size, int):
        fixes.append(Fix(f"tensor_parallel_size: auto for {name}",
                         with_model(name, tensor_parallel_size="auto")))
    need = tp * missing[name]
    fixes += _more_gpus(fleet, shape.gpu_type, need, tp, model)
    for partner in item.colocate_with:
        spec = next((m for m in models if m.name == partner), None)
        if spec is not None:
            fixes.append(Fix(f"replicas: {spec.replicas + missing[name]} for {partner} "
                             f"(more cards to share with)",
                             with_model(partner, replicas=spec.replicas + missing[name])))
    return Refusal(message, field=f"models.{name}.replicas", value=model.replicas, fixes=fixes,
                   fallback=f"more {shape.gpu_type} GPUs, or fewer models")


def _pin_fixes(model: ModelSpec) -> list[Fix]:
    hints = model.placement
    out: list[Fix] = []
    if hints.node is not None:
        out.append(Fix(f"drop placement.node of {model.name}",
                       with_model(model.name, placement={"node": None})))
    if hints.gpu_type is not None:
        out.append(Fix(f"drop placement.gpu_type of {model.name}",
                       with_model(model.name, placement={"gpu_type": None})))
    if hints.exclusive:
        out.append(Fix(f"drop placement.exclusive of {model.name}",
                       with_model(model.name, placement={"exclusive": False})))
    if hints.colocate_with:
        out.append(Fix(f"drop placement.colocate_with of {model.name}",
                       with_model(model.name, placement={"colocate_with": []})))
    return out


def _more_gpus(
    fleet: FleetSpec, gpu_type: str, need: int, tp: int, model: ModelSpec
) -> list[Fix]:
    """Add `need` GPUs of `gpu_type` to each node of that type it may use, or a new node."""
    if fleet.gpus is None:
        return []
    out: list[Fix] = []
    for node in fleet.gpus.nodes:
        if node.gpu_type != gpu_type:
            continue
        if model.placement.node is not None and node.name != model.placement.node:
            continue
        out.append(Fix(f"add {need} {gpu_type} GPU(s) to node {node.name} "
                       f"(count: {node.count + need})",
                       with_node(node.name, count=node.count + need)))
    if model.placement.node is None:
        name = f"new-{gpu_type.lower()}-node"
        out.append(Fix(f"a new node {name} with {max(need, tp)} {gpu_type} GPU(s)",
                       with_new_node(NodeSpec(name=name, gpu_type=gpu_type,
                                              count=max(need, tp)))))
    return out


def _gpus_with_room(
    placement: Placement, items: dict[str, Item], slots: list[Slot], shape: Shape, item: Item
) -> int:
    """GPUs the item may use (type, allowed node, exclusivity, no replica of its model)
    whose unallocated budget holds its minimum share."""
    used: Counter[tuple[str, int]] = Counter()
    holders: dict[tuple[str, int], list[Item]] = {s.key: [] for s in slots}
    for item_id, choice in placement.choices.items():
        placed = items[item_id]
        taken = placed.shape(choice.gpu_type, choice.tp)
        for slot in slots:
            if slot.key in choice.gpus():
                used[slot.key] += choice.units + taken.outside_units_for(slot.total_bytes)
                holders[slot.key].append(placed)

    def usable(slot: Slot) -> bool:
        here = holders[slot.key]
        if slot.gpu_type != shape.gpu_type or (item.nodes and slot.node not in item.nodes):
            return False
        if here and (item.exclusive or any(o.exclusive or o.model == item.model for o in here)):
            return False
        need = shape.min_units + shape.outside_units_for(slot.total_bytes)
        return slot.capacity_units - used[slot.key] >= need

    return sum(1 for s in slots if usable(s))


def _unplaced_spanning(
    placement: Placement,
    by_id: dict[str, Item],
    model: ModelSpec,
    placed: int,
    shape: Shape,
    slots: list[Slot],
    fleet: FleetSpec,
) -> Refusal:
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
    fixes = [Fix(f"replicas: {placed} for {model.name}", with_model(model.name, replicas=placed))
             if placed else Fix(f"remove {model.name}", without_model(model.name))]

    def add_nodes(fleet: FleetSpec) -> FleetSpec:
        for k in range(short):
            fleet = with_new_node(NodeSpec(name=f"new-{gpu.lower()}-node-{k + 1}",
                                           gpu_type=gpu, count=tp))(fleet)
        return fleet

    fixes.append(Fix(f"add {short} {gpu} node(s) with {tp} GPU(s) each", add_nodes))
    return Refusal(message, field=f"models.{model.name}.replicas", value=model.replicas,
                   fixes=fixes, fallback="larger nodes, so one node holds a replica")


def _nodes_with_free(placement: Placement, slots: list[Slot], gpu: str, tp: int) -> int:
    used = {key for c in placement.choices.values() for key in c.gpus()}
    free: Counter[str] = Counter(s.node for s in slots if s.gpu_type == gpu and s.key not in used)
    return sum(1 for count in free.values() if count >= tp)


def suggestions(
    model: ModelSpec,
    profile: ModelProfile,
    types: list[GpuType],
    fleet: FleetSpec,
    *,
    version: str,
    budget_fraction: float,
) -> list[Fix]:
    """Changes that make one replica fit, each found by sizing again (and then checked by
    planning the fleet with it)."""
    name = model.name
    out: list[Fix] = []
    base = base_settings(model, version)
    biggest = max(types, key=lambda t: (t.total_bytes, t.name))
    widest = max(t.max_gpus_per_node for t in types)
    tp = model.tensor_parallel_size
    if isinstance(tp, int) and tp > widest:  # a TP group never spans nodes: PP does
        stages = -(-tp // widest)
        out.append(Fix(
            f"tensor_parallel_size: {widest} and pipeline_parallel_size: {stages} (TP "
            f"{widest} on each of {stages} nodes)",
            with_model(name, tensor_parallel_size=widest, pipeline_parallel_size=stages),
        ))
        out.append(Fix("tensor_parallel_size: auto (at most one node's GPUs)",
                       with_model(name, tensor_parallel_size="auto")))
        return out
    length = _longest_length(profile, base, biggest, budget_fraction)
    for _ in range(4):  # the auto-fit ignores headroom: shorten until the planner accepts it
        if not length or not base.max_model_len or length >= base.max_model_len:
            break
        if _try(model, profile, [biggest], replace(base, max_model_len=length), version,
                budget_fraction) is not None:
            out.append(Fix(
                f"max_model_len: {length} (the longest one request fits on {biggest.name})",
                with_model(name, max_model_len=length),
            ))
            break
        length = int(length * 0.95) // 16 * 16
    changes: list[tuple[str, EngineSettings, dict[str, object]]] = []
    if model.kv_cache_dtype == "auto":
        changes.append(("kv_cache_dtype: fp8 (halves the KV cache)",
                        replace(base, kv_cache_dtype="fp8"), {"kv_cache_dtype": "fp8"}))
    if profile.quantization is None and model.quantization is None:
        changes.append(("quantization: fp8 (halves the weights)",
                        replace(base, quantization="fp8"), {"quantization": "fp8"}))
        if model.kv_cache_dtype == "auto":
            changes.append(("quantization: fp8 and kv_cache_dtype: fp8",
                            replace(base, quantization="fp8", kv_cache_dtype="fp8"),
                            {"quantization": "fp8", "kv_cache_dtype": "fp8"}))
    for label, settings, fields in changes:
        shape = _try(model, profile, types, settings, version, budget_fraction)
        if shape is not None:
            out.append(Fix(f"{label}: then TP {shape.tensor_parallel_size} on {shape.gpu_type} "
                           "fits", with_model(name, **fields)))
    out += _pipeline_suggestions(model, profile, types, base, version, budget_fraction)
    node = _largest_node(fleet, biggest.name)
    if biggest.max_gpus_per_node < 8 and model.tensor_parallel_size == "auto" and node:
        wider = replace(biggest, max_gpus_per_node=8)
        result = size_model(model, profile, wider, version=version, budget_fraction=budget_fraction)
        if isinstance(result, Shape):
            tp = result.tensor_parallel_size
            out.append(Fix(f"{tp} {biggest.name} GPUs on one node (TP {tp}; node {node} "
                           f"has {biggest.max_gpus_per_node})", with_node(node, count=tp)))
    larger = _larger_gpu(model, profile, biggest, version, budget_fraction)
    if larger and fleet.gpus is not None:
        out.append(larger)
    return out


def _largest_node(fleet: FleetSpec, gpu_type: str) -> str | None:
    if fleet.gpus is None:
        return None
    nodes = [n for n in fleet.gpus.nodes if n.gpu_type == gpu_type]
    return max(nodes, key=lambda n: n.count).name if nodes else None


def _pipeline_suggestions(
    model: ModelSpec,
    profile: ModelProfile,
    types: list[GpuType],
    base: EngineSettings,
    version: str,
    budget_fraction: float,
) -> list[Fix]:
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
            return [Fix(
                f"pipeline_parallel_size: {pp} (or auto): then TP {shape.tensor_parallel_size} "
                f"on each of {pp} {shape.gpu_type} nodes fits (a replica that spans nodes; "
                "deploy it with `inferplane render --target k8s|systemd`)",
                with_model(model.name, pipeline_parallel_size=pp),
            )]
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
    model: ModelSpec, profile: ModelProfile, current: GpuType, version: str, budget: float,
) -> Fix | None:
    """The smallest catalog GPU clearly larger than the inventory's largest that holds one
    replica; the fix swaps the nodes of that type for it."""
    for spec in sorted(known_gpus(), key=lambda g: (g.total_memory_bytes, g.name)):
        if spec.total_memory_bytes < 1.15 * current.total_bytes:
            continue
        gpu = GpuType(spec.name, spec.total_memory_bytes, spec, current.max_gpus_per_node)
        result = size_model(model, profile, gpu, version=version, budget_fraction=budget)
        if isinstance(result, Shape):
            def swap(fleet: FleetSpec, name: str = spec.name) -> FleetSpec:
                assert fleet.gpus is not None
                for node in fleet.gpus.nodes:
                    if node.gpu_type == current.name:
                        fleet = with_node(node.name, gpu_type=name)(fleet)
                return fleet

            return Fix(
                f"a larger GPU: {spec.name} ({spec.total_memory_gib:.0f} GiB) fits it at TP "
                f"{result.tensor_parallel_size}", swap,
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
