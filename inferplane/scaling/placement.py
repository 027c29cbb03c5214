"""Where a new replica goes: the planner's incremental placement (never moves running
instances; refuses with InferplaneError when the free room is too small)."""

from __future__ import annotations

from collections.abc import Callable

from inferplane.errors import InferplaneError
from inferplane.planner.plan import Plan, PlanInstance
from inferplane.spec import FleetSpec

# add_replicas(fleet, plan, model, count) -> a plan with `count` more replicas of `model`
Placer = Callable[[FleetSpec, Plan, str, int], Plan]


def planner_placer() -> Placer:
    """`inferplane.planner.incremental.add_replicas`, imported when first needed."""

    def place(fleet: FleetSpec, plan: Plan, model: str, count: int) -> Plan:
        from inferplane.planner.incremental import add_replicas

        return add_replicas(fleet, plan, model, count)

    return place


def added_instances(before: Plan, after: Plan) -> list[PlanInstance]:
    """The instances `after` has that `before` lacks."""
    old = {inst.id for inst in before.instances}
    return [inst for inst in after.instances if inst.id not in old]


def without(plan: Plan, ids: set[str]) -> Plan:
    """The plan minus some instances (removed, asleep, or tried as yielding)."""
    return plan.model_copy(update={"instances": [i for i in plan.instances if i.id not in ids]})


def with_instance(plan: Plan, inst: PlanInstance) -> Plan:
    return plan.model_copy(update={"instances": [*plan.instances, inst]})


def not_awake_together(fleet: FleetSpec, plan: Plan, models: list[str],
                       place: Placer) -> list[tuple[str, str]]:
    """Pairs of `models` whose replicas cannot be awake at once on the plan's inventory
    (one replica each, nothing else placed): they can only swap."""
    from itertools import combinations

    empty = plan.model_copy(update={"instances": []})
    out: list[tuple[str, str]] = []
    for a, b in combinations(sorted(models), 2):
        try:
            place(fleet, place(fleet, empty, a, 1), b, 1)
        except InferplaneError:
            out.append((a, b))
    return out
