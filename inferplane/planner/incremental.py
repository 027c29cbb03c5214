"""Change a running fleet's plan without moving what runs: add or remove replicas.

    plan = add_replicas(fleet, plan, "qwen3-8b", 1)      # the autoscaler scales up
    plan = remove_replicas(fleet, plan, ["qwen3-8b-1"])  # ... and down

`add_replicas` places the new replicas on the room the plan leaves (the same shapes, card
budget and rules as `plan_fleet`: greedy only, fast and deterministic), every existing
instance fixed where it is with its share. A new replica that shares a card with running
instances gets an explicit KV pool and starts after them. Existing instances are returned
unchanged except `shares_gpu_with`, which then lists the newcomer (their argv, env and
share are what they run with). Raises InferplaneError when the replicas do not fit.

`cannot_run_together` / `swap_report`: which scaled models no plan can hold awake at the
same time (one replica each) - `plan_fleet` adds them as "swap:" warnings, so the plan says
which models the autoscaler will have to take turns on the GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from itertools import combinations

from inferplane.errors import InferplaneError
from inferplane.gpus.discovery import DiscoveredGpu
from inferplane.models.profile import ModelProfile
from inferplane.planner.build import (
    BASE_MASTER_PORT,
    BASE_PORT,
    BASE_RAY_PORT,
    Ports,
    gpu_table,
    inventory_slots,
    kv_pool_supported,
    placement_problem,
    plan_instance,
    plan_totals,
)
from inferplane.planner.colocation import share_cards
from inferplane.planner.fixes import with_model
from inferplane.planner.greedy import place_greedy
from inferplane.planner.placement import Choice, Item
from inferplane.planner.plan import Plan, PlanInstance
from inferplane.planner.sizing import UNITS
from inferplane.spec import FleetSpec


def add_replicas(
    fleet: FleetSpec,
    plan: Plan,
    model: str,
    count: int,
    *,
    discovered: list[DiscoveredGpu] | None = None,
    profiles: Mapping[str, ModelProfile] | None = None,
) -> Plan:
    """`plan` with `count` more replicas of `model`, placed around the running ones."""
    if plan.device == "cpu":  # cores and RAM kept for them (planner/cpu.py)
        from inferplane.planner.cpu import add_cpu_replicas

        return add_cpu_replicas(fleet, plan, model, count, profiles=profiles)
    spec = fleet.model(model)
    if spec is None or spec.source is None:
        raise InferplaneError("not a placed model of the fleet", field="model", value=model,
                              fix="name a model with a source")
    if count < 1:
        raise InferplaneError("must be >= 1", field="count", value=count,
                              fix="add at least one replica")
    if any(i.spans_nodes for i in plan.instances_of(model)):
        raise InferplaneError(
            f"{model} spans nodes; its replicas are added by the cluster, not one host",
            field=f"models.{model}", value=model, fix="scale it with Kubernetes (LWS)",
        )
    current = plan.instances_of(model)
    # Size the model once (every replica is identical); the fleet's other models too, for
    # the running instances' shapes - also those the fleet starts at 0 replicas (scale
    # from zero) that run now.
    sized = with_model(model, replicas=max(1, len(current)))(fleet)
    running_models = {inst.model for inst in plan.instances} - {model}
    sized = sized.model_copy(update={"models": [
        m.model_copy(update={"replicas": 1}) if m.name in running_models and m.replicas == 0
        else m for m in sized.models]})
    slots, items, _, loaded = placement_problem(
        sized, card_budget_fraction=plan.card_budget_fraction, discovered=discovered,
        profiles=profiles,
    )
    template = {item.model: item for item in items}
    if model not in template:
        raise InferplaneError("the model has no shape on this inventory", field="model",
                              value=model, fix="plan the fleet again")
    running: list[Item] = []
    fixed: dict[str, Choice] = {}
    for inst in plan.instances:
        if inst.model not in template:
            raise InferplaneError(
                "the plan does not match the fleet", field="plan", value=inst.model,
                fix="plan the fleet again: `inferplane plan FLEET.yaml --out plan.json`",
            )
        running.append(replace(template[inst.model], id=inst.id, replica=inst.replica))
        fixed[inst.id] = _choice_of(inst)
    taken = {i.replica for i in current}
    numbers = [r for r in range(len(current) + count + len(taken)) if r not in taken][:count]
    new = [replace(template[model], id=f"{model}-{r}", replica=r) for r in numbers]
    for item in running:
        if not _has_shape(item, fixed[item.id]):
            raise InferplaneError(
                f"{item.id} runs a shape the planner no longer gives this model",
                field="plan", value=item.id, fix="plan the fleet again",
            )
    # Owned GPUs (utilize): a new replica takes an empty card before a busy one, in the
    # shape its siblings run (no wider TP for more held: replicas stay alike).
    placement = place_greedy(running + new, slots, plan.policy, fixed=fixed,
                             prefer_empty=plan.objective == "utilize")
    missing = [i.id for i in new if i.id not in placement.choices]
    if missing:
        smallest = min((s for shapes in template[model].shapes.values() for s in shapes),
                       key=lambda s: (s.gpus, s.min_units))
        raise InferplaneError(
            f"{model}: {len(missing)} more replica(s) do not fit next to the running "
            f"instances (the smallest way: TP {smallest.tensor_parallel_size} on "
            f"{smallest.gpu_type} at {smallest.min_units / 100:.1f}% of each card)",
            field=f"models.{model}.replicas", value=len(current) + count,
            fix="stop an idle replica of another model first, or add GPUs",
        )
    by_id = {item.id: item for item in running + new}
    shares = share_cards(by_id, placement.choices, slots, frozen=frozenset(fixed),
                         kv_pool=kv_pool_supported(fleet.engine.version))
    slot_of = {s.key: s for s in slots}
    port = max([i.port for i in plan.instances], default=BASE_PORT - 1) + 1
    added: list[PlanInstance] = []
    warnings = list(plan.warnings)
    for n, item in enumerate(new):
        choice = placement.choices[item.id]
        share = shares[item.id]
        mates = [m for m in share.shares_gpu_with if m in fixed]
        share = replace(share, start_after=tuple(sorted({*share.start_after, *mates})))
        instance, notes = plan_instance(
            spec, loaded[model], item, choice, share,
            [[slot_of[(node, i)] for i in indices] for node, indices in choice.groups()],
            Ports(port + n, BASE_MASTER_PORT, BASE_RAY_PORT), fleet,
        )
        added.append(instance)
        warnings += [w for w in notes if w not in warnings]
    newcomers = {i.id: i for i in added}
    kept = [
        inst.model_copy(update={"shares_gpu_with": sorted(
            {*inst.shares_gpu_with, *(n for n, a in newcomers.items()
                                       if inst.id in a.shares_gpu_with)})})
        for inst in plan.instances
    ]
    instances = _in_fleet_order(fleet, kept + added)
    gpus = gpu_table(slots, instances, plan.card_budget_fraction, plan.engine_version)
    return plan.model_copy(update={
        "instances": instances, "gpus": gpus, "warnings": warnings,
        "totals": plan_totals(gpus, "greedy (incremental)", False),
    })


def remove_replicas(
    fleet: FleetSpec,
    plan: Plan,
    instance_ids: list[str],
    *,
    discovered: list[DiscoveredGpu] | None = None,
) -> Plan:
    """`plan` without the given instances (drained and stopped by the caller); the others
    are unchanged but for `shares_gpu_with` / `start_after` naming a removed one."""
    gone = set(instance_ids)
    unknown = gone - {i.id for i in plan.instances}
    if unknown:
        raise InferplaneError("no such instance in the plan", field="instances",
                              value=sorted(unknown), fix="use ids from `inferplane status`")
    if plan.device == "cpu":
        from inferplane.planner.cpu import remove_cpu_replicas

        return remove_cpu_replicas(plan, instance_ids)
    instances = [
        inst.model_copy(update={
            "shares_gpu_with": [m for m in inst.shares_gpu_with if m not in gone],
            "start_after": [m for m in inst.start_after if m not in gone],
        })
        for inst in plan.instances if inst.id not in gone
    ]
    slots = inventory_slots(fleet, discovered, plan.card_budget_fraction)
    gpus = gpu_table(slots, instances, plan.card_budget_fraction, plan.engine_version)
    return plan.model_copy(update={
        "instances": instances, "gpus": gpus,
        "totals": plan_totals(gpus, plan.totals.solver, plan.totals.solver_optimal),
    })


MAX_SWAP_CHECK = 8  # scaled models whose pairs `plan` checks (28 small plans at most)


def cannot_run_together(
    fleet: FleetSpec,
    models: list[str],
    card_budget_fraction: float = 0.95,
    *,
    discovered: list[DiscoveredGpu] | None = None,
    profiles: Mapping[str, ModelProfile] | None = None,
) -> list[tuple[str, str]]:
    """Pairs of `models` for which no plan of the inventory holds one replica of each (and
    nothing else): the autoscaler can only let them take turns (sleep/wake swapping)."""
    from inferplane.planner.build import plan_fleet

    unscaled = fleet.scaling.model_copy(update={"models": {}})
    out: list[tuple[str, str]] = []
    for a, b in combinations(sorted(models), 2):
        pair = fleet.model_copy(update={"scaling": unscaled, "models": [
            m.model_copy(update={"replicas": 1}) for m in fleet.models if m.name in (a, b)
        ]})
        try:
            plan_fleet(pair, card_budget_fraction=card_budget_fraction, time_limit_s=0.5,
                       discovered=discovered, profiles=profiles, check_fixes=False)
        except InferplaneError:
            out.append((a, b))
    return out


def swap_report(
    fleet: FleetSpec,
    plan: Plan,
    *,
    discovered: list[DiscoveredGpu] | None = None,
    profiles: Mapping[str, ModelProfile] | None = None,
) -> list[str]:
    """The plan's note on scaled models that can never be awake together (docs/scaling.md)."""
    scaled = sorted(name for name in fleet.scaling.models
                    if (spec := fleet.model(name)) is not None and spec.source is not None)
    if len(scaled) < 2 or not plan.gpus:
        return []
    if len(scaled) > MAX_SWAP_CHECK:  # one small plan per pair: keep `plan` quick
        return [f"swap: {len(scaled)} scaled models; which pairs can only take turns is not "
                f"checked above {MAX_SWAP_CHECK} (`inferplane up` reports it at start)"]
    return [
        f"swap: {a} and {b} cannot be awake together on this inventory (one replica each); "
        "the autoscaler puts one to sleep (or stops it) to wake the other"
        for a, b in cannot_run_together(fleet, scaled, plan.card_budget_fraction,
                                        discovered=discovered, profiles=profiles)
    ]


def _choice_of(inst: PlanInstance) -> Choice:
    ranks = tuple((r.node, tuple(r.gpu_indices)) for r in inst.ranks)
    return Choice(inst.gpu_type, inst.node, tuple(inst.gpu_indices), ranks,
                  round(inst.gpu_memory_utilization * UNITS))


def _has_shape(item: Item, choice: Choice) -> bool:
    try:
        item.shape(choice.gpu_type, choice.tp)
    except KeyError:
        return False
    return True


def _in_fleet_order(fleet: FleetSpec, instances: list[PlanInstance]) -> list[PlanInstance]:
    order = {m.name: n for n, m in enumerate(fleet.models)}
    return sorted(instances, key=lambda i: (order.get(i.model, len(order)), i.replica))
