"""`plan_fleet`: size every model, place every replica, and write the Plan.

    fleet = load_fleet("fleet.yaml")
    plan = plan_fleet(fleet)                 # binpack, card budget 0.95, CP-SAT <= 5 s
    plan.totals.gpus_used, plan.instances[0].argv

Pure apart from reading model configs (pass `profiles` to skip even that): the same fleet
gives the same Plan. Raises InferplaneError naming the model, the best it got and what
would make it fit when something cannot be placed (see `explain`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from inferplane.engines.vllm import VllmArgs, flag_problem
from inferplane.engines.vllm.engine import ENGINE as VLLM
from inferplane.engines.vllm.versions import era_of
from inferplane.errors import InferplaneError
from inferplane.estimator.memory import estimate_memory
from inferplane.estimator.pipeline import stage_profile, stages
from inferplane.estimator.types import MemoryEstimate, RankMemory
from inferplane.gpus import find_gpu, lookup_gpu
from inferplane.gpus.cpu_host import CpuHost
from inferplane.gpus.discovery import DiscoveredGpu
from inferplane.gpus.spec import GIB
from inferplane.models import load_profile
from inferplane.models.profile import ModelProfile
from inferplane.planner import explain, fixes
from inferplane.planner.advice import model_notes
from inferplane.planner.colocation import CardShare, share_cards
from inferplane.planner.greedy import allowed_nodes, place_greedy
from inferplane.planner.lora import lora_args
from inferplane.planner.placement import Choice, Item, Placement, Slot
from inferplane.planner.plan import (
    InstanceMemory,
    PlacementPolicy,
    Plan,
    PlanEndpoint,
    PlanGpu,
    PlanInstance,
    PlanObjective,
    PlanRank,
    PlanTotals,
)
from inferplane.planner.sizing import (
    UNITS,
    GpuType,
    Shape,
    SizingFailure,
    candidate_shapes,
    graph_bytes,
)
from inferplane.planner.solver import solve_around_spanning
from inferplane.spec import FleetSpec, ModelSpec
from inferplane.spec.planning import OBJECTIVES
from inferplane.spec.sources import missing_source_error

BASE_PORT = 8100
DISCOVERED_NODE = "local"
# Replicas that span nodes: each gets its own coordination ports, so two leaders on one
# host never collide (vLLM's --master-port default is 29501, `ray start --head` 6379).
BASE_MASTER_PORT = 29501
BASE_RAY_PORT = 6379


def plan_fleet(
    fleet: FleetSpec,
    *,
    policy: PlacementPolicy = "binpack",
    card_budget_fraction: float = 0.95,
    time_limit_s: float = 5.0,
    discovered: list[DiscoveredGpu] | None = None,
    profiles: Mapping[str, ModelProfile] | None = None,
    fleet_file: str = "",
    check_fixes: bool = True,
    objective: PlanObjective | None = None,
    cpu_host: CpuHost | None = None,
) -> Plan:
    """Place every replica of every model of `fleet` on its GPUs (see docs/plan.md).
    `check_fixes`: plan again with each suggested fix of a refusal, printing only those
    that plan (off inside that check). `objective`: the fleet's `planning.objective`
    unless given (`inferplane capacity` plans for the fewest GPUs). A CPU fleet
    (`engine.device: cpu`) is placed on cores and host RAM instead (planner/cpu.py;
    `cpu_host`: the discovered host)."""
    if fleet.on_cpu:
        from inferplane.planner.cpu import plan_cpu_fleet

        return plan_cpu_fleet(fleet, host=cpu_host, profiles=profiles, fleet_file=fleet_file)
    if not 0 < card_budget_fraction <= 1:
        raise InferplaneError(
            "must be in (0, 1]", field="card_budget_fraction", value=card_budget_fraction,
            fix="use a fraction of each card such as 0.95",
        )
    if policy not in ("binpack", "spread"):
        raise InferplaneError(
            "unknown placement policy", field="policy", value=policy, fix="binpack or spread"
        )
    goal: PlanObjective = objective or fleet.planning.objective
    if goal not in OBJECTIVES:
        raise InferplaneError(
            "unknown planning objective", field="planning.objective", value=goal,
            fix=" or ".join(OBJECTIVES),
        )
    slots, items, models, loaded = placement_problem(
        fleet, card_budget_fraction=card_budget_fraction, discovered=discovered,
        profiles=profiles, check_fixes=check_fixes,
    )
    placement = place_greedy(items, slots, policy, objective=goal)
    if time_limit_s > 0 and (policy == "binpack" or not _perfect(placement, items)):
        solved = solve_around_spanning(items, slots, placement, time_limit_s=time_limit_s,
                                       policy=policy, objective=goal)
        if solved is not None:
            solved.notes = [n for n in placement.notes if n.startswith("solver")]
            placement = solved
    if placement.unplaced:
        refusal = explain.unplaced(placement, items, models, slots, fleet)
        raise refusal.error(_checked(fleet, refusal, policy, card_budget_fraction,
                                     discovered, profiles, check_fixes, goal))
    plan = _assemble(fleet, items, loaded, slots, placement, policy, card_budget_fraction,
                     fleet_file, goal)
    if len(fleet.scaling.models) > 1:  # models the autoscaler may have to take turns
        from inferplane.planner.incremental import swap_report

        swaps = swap_report(fleet, plan, discovered=discovered, profiles=profiles)
        if swaps:
            plan = plan.model_copy(update={"warnings": [*plan.warnings, *swaps]})
    if any(b.sleep is not None and b.sleep.level == 1 for b in fleet.scaling.models.values()):
        from inferplane.planner.host_memory import host_ram_warnings

        ram = host_ram_warnings(fleet, plan, discovered=discovered, profiles=profiles)
        if ram:
            plan = plan.model_copy(update={"warnings": [*plan.warnings, *ram]})
    return plan


def placement_problem(
    fleet: FleetSpec,
    *,
    card_budget_fraction: float = 0.95,
    discovered: list[DiscoveredGpu] | None = None,
    profiles: Mapping[str, ModelProfile] | None = None,
    check_fixes: bool = False,
) -> tuple[list[Slot], list[Item], list[ModelSpec], dict[str, ModelProfile]]:
    """The GPUs, the sized replicas to place, the placed models and their profiles (the
    input of `place_greedy` and `solve`; benchmarks use it to compare placers)."""
    slots = inventory_slots(fleet, discovered, card_budget_fraction)
    types = gpu_types(slots, fleet, discovered)
    version = fleet.engine.version
    models = [m for m in fleet.placed_models if m.replicas > 0]
    loaded = {m.name: _profile(m, profiles) for m in models}
    items: list[Item] = []
    sharing = {m.name for m in models if m.placement.colocate_with} | {
        name for m in models for name in m.placement.colocate_with}
    for order, model in enumerate(models):
        shapes: dict[str, tuple[Shape, ...]] = {}
        failures: list[SizingFailure] = []
        for gpu_type in _allowed_types(model, fleet, types):
            result = candidate_shapes(
                model, loaded[model.name], types[gpu_type], version=version,
                budget_fraction=card_budget_fraction,
            )
            if isinstance(result, SizingFailure):
                failures.append(result)
            else:
                shapes[gpu_type] = tuple(
                    replace(shape, colocated=model.name in sharing) for shape in result)
        if not shapes:
            refusal = explain.unsized(
                model, loaded[model.name], failures, list(types.values()), fleet,
                version=version, budget_fraction=card_budget_fraction,
            )
            raise refusal.error(_checked(fleet, refusal, "binpack", card_budget_fraction,
                                         discovered, profiles, check_fixes))
        partners = sum(m.replicas for m in models if m.name in model.placement.colocate_with)
        items += [
            Item(
                id=f"{model.name}-{r}", model=model.name, replica=r, order=order,
                shapes=shapes, nodes=allowed_nodes(model.placement),
                exclusive=model.placement.exclusive,
                colocate_with=tuple(model.placement.colocate_with),
                colocate_count=partners,
            )
            for r in range(model.replicas)
        ]
    return slots, items, models, loaded


def _checked(
    fleet: FleetSpec,
    refusal: explain.Refusal,
    policy: PlacementPolicy,
    budget: float,
    discovered: list[DiscoveredGpu] | None,
    profiles: Mapping[str, ModelProfile] | None,
    check: bool,
    objective: PlanObjective | None = None,
) -> list[fixes.Fix]:
    """The refusal's fixes that make the fleet plan (unchecked when `check` is off: the
    caller is itself checking a fix and only needs to know that this fleet fails)."""
    if not check:
        return refusal.fixes

    def plans(changed: FleetSpec) -> Plan:
        return plan_fleet(changed, policy=policy, card_budget_fraction=budget,
                          time_limit_s=fixes.CHECK_TIME_LIMIT_S, discovered=discovered,
                          profiles=profiles, check_fixes=False, objective=objective)

    return fixes.verified(fleet, refusal.fixes, plans)


def _perfect(placement: Placement, items: list[Item]) -> bool:
    """Every replica placed and meeting its demand: nothing for the solver to improve
    but GPU counts, which `spread` does not minimise."""
    by_id = {i.id: i for i in items}
    return not placement.unplaced and all(
        by_id[i].shape(c.gpu_type, c.tp).meets(c.units) for i, c in placement.choices.items()
    )


def inventory_slots(
    fleet: FleetSpec, discovered: list[DiscoveredGpu] | None, budget: float
) -> list[Slot]:
    units = int(budget * UNITS)
    if not fleet.discover_gpus and fleet.gpus is None:
        return []  # nothing to place: no inventory needed
    if fleet.gpus is not None:
        slots: list[Slot] = []
        for node in fleet.gpus.nodes:
            spec = lookup_gpu(node.gpu_type)
            link = spec.interconnect if node.interconnect == "auto" else node.interconnect
            slots += [
                Slot(node.name, i, spec.name, spec.total_memory_bytes, link, units)
                for i in range(node.count)
            ]
        return slots
    if not discovered:
        raise InferplaneError(
            "the fleet says gpus: discover but no GPUs were found", field="gpus",
            value="discover",
            fix="run on a host with NVIDIA GPUs, or list them under gpus: nodes:",
        )
    return [
        Slot(
            DISCOVERED_NODE, gpu.index, gpu.spec.name if gpu.spec else gpu.name,
            gpu.total_bytes, gpu.spec.interconnect if gpu.spec else "pcie", units, gpu.uuid,
        )
        for gpu in sorted(discovered, key=lambda g: g.index)
    ]


def gpu_types(
    slots: list[Slot], fleet: FleetSpec, discovered: list[DiscoveredGpu] | None
) -> dict[str, GpuType]:
    specs = {g.spec.name: g.spec for g in discovered or [] if g.spec is not None}
    per_node: dict[tuple[str, str], int] = {}
    for slot in slots:
        per_node[(slot.node, slot.gpu_type)] = per_node.get((slot.node, slot.gpu_type), 0) + 1
    out: dict[str, GpuType] = {}
    for slot in slots:
        if slot.gpu_type in out:
            continue
        spec = specs.get(slot.gpu_type)
        if spec is None and fleet.gpus is not None:
            spec = lookup_gpu(slot.gpu_type)
        counts = tuple(sorted((n for (_, t), n in per_node.items() if t == slot.gpu_type),
                              reverse=True))
        out[slot.gpu_type] = GpuType(slot.gpu_type, slot.total_bytes, spec, counts[0], counts)
    return out


def _allowed_types(model: ModelSpec, fleet: FleetSpec, types: dict[str, GpuType]) -> list[str]:
    allowed = list(types)
    if model.placement.gpu_type is not None:
        allowed = [t for t in allowed if t == model.placement.gpu_type]
    if model.placement.node is not None and fleet.gpus is not None:
        node = fleet.gpus.node(model.placement.node)
        allowed = [t for t in allowed if node is not None and t == node.gpu_type]
    if not allowed:
        wanted = model.placement.gpu_type or model.placement.node
        raise InferplaneError(
            f"no GPU in the inventory matches the placement hint {wanted!r}",
            field=f"models.{model.name}.placement", value=wanted,
            fix=f"use one of the inventory's GPU types: {', '.join(types)}, or drop the hint",
        )
    return allowed


def _profile(model: ModelSpec, profiles: Mapping[str, ModelProfile] | None) -> ModelProfile:
    if profiles is not None and model.name in profiles:
        return profiles[model.name]
    assert model.source is not None
    if not Path(model.source).exists():
        raise missing_source_error(model.name, model.source)
    return load_profile(model.source)


def _assemble(
    fleet: FleetSpec,
    items: list[Item],
    profiles: Mapping[str, ModelProfile],
    slots: list[Slot],
    placement: Placement,
    policy: PlacementPolicy,
    budget: float,
    fleet_file: str,
    objective: PlanObjective = "utilize",
) -> Plan:
    by_id = {item.id: item for item in items}
    shares = share_cards(by_id, placement.choices, slots,
                         kv_pool=kv_pool_supported(fleet.engine.version),
                         alike=objective == "utilize")
    slot_of = {s.key: s for s in slots}
    models = {m.name: m for m in fleet.placed_models}
    ordered = sorted(items, key=lambda i: (i.order, i.replica))
    warnings: list[str] = list(placement.notes)
    from_zero = [m.name for m in fleet.placed_models
                 if m.replicas == 0 and m.name in fleet.scaling.models]
    if from_zero:
        warnings.append(
            f"{', '.join(from_zero)} start at 0 replicas (scale from zero): a replica is "
            "placed when the first request arrives, on the room free then"
        )
    elif not items:
        routed = ", ".join(m.name for m in fleet.endpoint_models) or "none"
        warnings.append(
            "nothing to place: no model has a source and replicas >= 1; the plan holds "
            f"only the gateway's routes to endpoints ({routed}), no GPU was looked at"
        )
    instances: list[PlanInstance] = []
    spanning = 0
    for n, item in enumerate(ordered):
        choice = placement.choices[item.id]
        ports = Ports(BASE_PORT + n, BASE_MASTER_PORT + spanning, BASE_RAY_PORT + spanning)
        spanning += 1 if choice.spans_nodes else 0
        instance, notes = plan_instance(
            models[item.model], profiles[item.model], item, choice, shares[item.id],
            [[slot_of[(node, i)] for i in indices] for node, indices in choice.groups()],
            ports, fleet,
        )
        instances.append(instance)
        warnings += [w for w in notes if w not in warnings]
    card_bytes = {s.gpu_type: s.total_bytes for s in slots}
    warnings += [w for w in model_notes(instances, by_id, models, card_bytes, objective)
                 if w not in warnings]
    gpus = gpu_table(slots, instances, budget, fleet.engine.version)
    totals = plan_totals(gpus, placement.solver, placement.optimal)
    return Plan(
        fleet_file=fleet_file,
        engine=fleet.engine.kind,
        engine_version=fleet.engine.version,
        policy=policy,
        objective=objective,
        card_budget_fraction=budget,
        instances=instances,
        gpus=gpus,
        endpoints=[
            PlanEndpoint(model=m.name, urls=list(m.endpoints or []))
            for m in fleet.endpoint_models
        ],
        totals=totals,
        warnings=warnings,
    )


def kv_pool_supported(version: str) -> bool:
    """Whether co-located instances get `--kv-cache-memory-bytes` (vLLM 0.11+); before,
    the utilization shares and the sequential start keep them apart."""
    return flag_problem("kv-cache-memory-bytes", version) is None


def plan_totals(gpus: list[PlanGpu], solver: str, optimal: bool) -> PlanTotals:
    used = [g for g in gpus if g.instances]
    free_total = sum(g.free_gib for g in gpus)
    free_on_used = sum(g.free_gib for g in used)
    mem_used = sum(g.memory_gib for g in used)
    return PlanTotals(
        gpus_total=len(gpus),
        gpus_used=len(used),
        gpus_idle=len(gpus) - len(used),
        gpus_needed_at_peak=len(used),
        fragmentation=round(free_on_used / free_total, 4) if free_total > 0 else 0.0,
        memory_efficiency=round(sum(g.used_gib for g in used) / mem_used, 4) if mem_used else 0.0,
        solver=solver,
        solver_optimal=optimal,
    )


@dataclass(frozen=True)
class Ports:
    http: int  # the engine's API port (the leader's, for a replica that spans nodes)
    master: int  # --master-port of a native multi-node replica
    ray: int  # the Ray head's port of a Ray multi-node replica


def plan_instance(
    model: ModelSpec,
    profile: ModelProfile,
    item: Item,
    choice: Choice,
    share: CardShare,
    rank_slots: list[list[Slot]],
    ports: Ports,
    fleet: FleetSpec,
) -> tuple[PlanInstance, list[str]]:
    shape = item.shape(choice.gpu_type, choice.tp)
    slots = rank_slots[0]
    total = slots[0].total_bytes
    util = share.units / UNITS
    kv_bytes = shape.kv_bytes_at(share.units, total)
    settings = replace(
        shape.settings, gpu_memory_utilization=util,
        kv_cache_memory_bytes=share.kv_cache_memory_bytes or kv_bytes,
    )
    spec = find_gpu(choice.gpu_type)
    est = estimate_memory(profile, settings, gpu=spec, gpu_memory_bytes=total)
    notes = list(shape.warnings) + [f"{item.id}: {e}" for e in est.errors]
    notes += [f"{model.name}: {w}" for w in est.warnings if not w.startswith("P09")]
    if est.ranks:
        memories = [_rank_memory(est, rank, shape, profile) for rank in est.ranks]
        memory = memories[est.worst_rank]
        weights_total = sum(int(r.weights_gib * GIB) for r in est.ranks) \
            * shape.tensor_parallel_size
    else:
        graph_gib = (shape.non_kv_bytes - int((est.weights_gib + est.lora_gib
                                               + est.activation_gib
                                               + est.non_torch_gib) * GIB)) / GIB
        if not est.cuda_graph_in_budget:
            graph_gib = (shape.outside_bytes - int(est.cuda_context_gib * GIB)) / GIB
        memory = _memory(est, est.weights_gib, est.kv_cache_gib, est.activation_gib,
                         est.non_torch_gib, graph_gib, est.lora_gib)
        memories = [memory]
        weights_total = int(est.weights_gib * GIB) * shape.tensor_parallel_size
    args = VllmArgs(
        source=model.source or "",
        served_model_name=model.engine_model_name,
        port=ports.http,
        max_model_len=shape.max_model_len,
        tensor_parallel_size=shape.tensor_parallel_size,
        pipeline_parallel_size=shape.pipeline_parallel_size,
        gpu_memory_utilization=util,
        max_num_seqs=est.max_num_seqs,
        max_num_batched_tokens=est.max_num_batched_tokens,
        dtype=model.dtype,
        quantization=model.quantization,
        kv_cache_dtype=model.kv_cache_dtype,
        kv_cache_memory_bytes=share.kv_cache_memory_bytes,
        enforce_eager=model.enforce_eager,
        task=model.task,
        cudagraph_capture_sizes=shape.capture_sizes,
        lora=lora_args(model),
        extra_args=model.extra_args,
    )
    launches = VLLM.launches(args, version=fleet.engine.version, spans_nodes=choice.spans_nodes,
                             master_port=ports.master, ray_port=ports.ray)
    argvs = [list(launch.argv) for launch in launches]
    envs = [
        {**launch.env, **fleet.engine.extra_env, **model.env,
         **placement_env(group, fleet, choice.spans_nodes)}
        for launch, group in zip(launches, rank_slots, strict=True)
    ]
    ranks: list[PlanRank] = []
    if choice.spans_nodes:
        layers = est.ranks
        for rank, ((node, indices), group) in enumerate(zip(choice.groups(), rank_slots,
                                                            strict=True)):
            ranks.append(PlanRank(
                rank=rank, node=node, gpu_indices=list(indices), gpu_uuids=_uuids(group),
                argv=argvs[rank], env=envs[rank],
                layers=[layers[rank].start_layer, layers[rank].end_layer],
                memory=memories[rank],
            ))
    instance = PlanInstance(
        id=item.id,
        model=model.name,
        served_model_name=model.engine_model_name,
        replica=item.replica,
        node=choice.node,
        gpu_type=choice.gpu_type,
        gpu_indices=list(choice.indices),
        gpu_uuids=_uuids(slots),
        tensor_parallel_size=shape.tensor_parallel_size,
        gpu_memory_utilization=util,
        kv_cache_memory_bytes=share.kv_cache_memory_bytes,
        shares_gpu_with=list(share.shares_gpu_with),
        start_after=list(share.start_after),
        port=ports.http,
        max_model_len=shape.max_model_len,
        max_num_seqs=est.max_num_seqs,
        max_num_batched_tokens=est.max_num_batched_tokens,
        weights_bytes=weights_total,
        memory=memory,
        argv=argvs[0],
        env=envs[0],
        pipeline_parallel_size=shape.pipeline_parallel_size,
        ranks=ranks,
    )
    return instance, notes


def _uuids(slots: list[Slot]) -> list[str] | None:
    return [s.uuid for s in slots if s.uuid] if all(s.uuid for s in slots) else None


def _memory(
    est: MemoryEstimate, weights_gib: float, kv_cache_gib: float, activation_gib: float,
    non_torch_gib: float, graph_gib: float, lora_gib: float = 0.0,
) -> InstanceMemory:
    return InstanceMemory(
        lora_gib=lora_gib,
        weights_gib=weights_gib,
        kv_cache_gib=round(kv_cache_gib, 4),
        activation_gib=activation_gib,
        non_torch_gib=non_torch_gib,
        cuda_graph_gib=round(max(0.0, graph_gib), 4),
        cuda_context_gib=est.cuda_context_gib,
        kv_cache_tokens=est.kv_cache_tokens,
        max_concurrency=est.max_concurrency,
        kv_bytes_per_token=est.kv_bytes_per_token,
    )


def _rank_memory(
    est: MemoryEstimate, rank: RankMemory, shape: Shape, profile: ModelProfile
) -> InstanceMemory:
    """One pipeline stage's per-GPU memory; KV tokens and concurrency are the replica's."""
    graph_gib = rank.cuda_graph_gib
    if shape.capture_sizes is not None and not shape.settings.enforce_eager:
        stage = stages(profile.num_layers, shape.pipeline_parallel_size,
                       shape.settings.pipeline_layer_partition)[rank.rank]
        graph_gib = graph_bytes(stage_profile(profile, stage), shape.capture_sizes) / GIB
    return _memory(est, rank.weights_gib, rank.kv_cache_gib, rank.activation_gib,
                   rank.non_torch_gib, graph_gib, rank.lora_gib)


def placement_env(
    slots: list[Slot], fleet: FleetSpec | None = None, spans_nodes: bool = False
) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES as NVML indices in PCI order (P20, P21) and NCCL settings from
    the interconnect (P34): TP groups without NVLink get NCCL_P2P_DISABLE=1, the field's
    fix for NCCL hangs and watchdog timeouts on PCIe-only boards (S2). A node of a replica
    that spans nodes also gets NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME when the inventory
    names its `network_interface` (never guessed)."""
    env = {
        "CUDA_VISIBLE_DEVICES": ",".join(str(s.index) for s in slots),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    if len(slots) > 1 and any(s.interconnect != "nvlink" for s in slots):
        env["NCCL_P2P_DISABLE"] = "1"
    if spans_nodes and fleet is not None and fleet.gpus is not None:
        node = fleet.gpus.node(slots[0].node)
        if node is not None and node.network_interface is not None:
            env["NCCL_SOCKET_IFNAME"] = node.network_interface
            env["GLOO_SOCKET_IFNAME"] = node.network_interface
    return env


def _on(inst: PlanInstance, slot: Slot) -> bool:
    if inst.ranks:
        return any(r.node == slot.node and slot.index in r.gpu_indices for r in inst.ranks)
    return inst.node == slot.node and slot.index in inst.gpu_indices


def _memory_at(inst: PlanInstance, slot: Slot) -> InstanceMemory:
    """The instance's per-GPU memory on `slot` (its pipeline stage's, when it spans nodes)."""
    for rank in inst.ranks:
        if rank.node == slot.node and slot.index in rank.gpu_indices and rank.memory:
            return rank.memory
    return inst.memory


def gpu_table(
    slots: list[Slot], instances: list[PlanInstance], budget: float, version: str
) -> list[PlanGpu]:
    graphs_inside = era_of(version) == "v1new"
    out: list[PlanGpu] = []
    for slot in slots:
        here = [i for i in instances if _on(i, slot)]
        total_gib = slot.total_bytes / GIB
        used = sum(
            i.gpu_memory_utilization * total_gib + _memory_at(i, slot).cuda_context_gib
            + (0.0 if graphs_inside else _memory_at(i, slot).cuda_graph_gib)
            for i in here
        )
        out.append(
            PlanGpu(
                node=slot.node, index=slot.index, uuid=slot.uuid, type=slot.gpu_type,
                memory_gib=round(total_gib, 2), budget_gib=round(budget * total_gib, 2),
                used_gib=round(used, 2), free_gib=round(total_gib - used, 2),
                instances=[i.id for i in here],
            )
        )
    return out
