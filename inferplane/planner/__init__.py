"""The planner: memory estimates, validation rules and fleet placement (pure functions).

`from inferplane.planner import plan_fleet` places a fleet; `Plan` is its result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inferplane.planner.build import plan_fleet
    from inferplane.planner.plan import Plan

__all__ = ["Plan", "plan_fleet"]


def __getattr__(name: str) -> Any:
    # Lazy: inferplane.spec imports planner modules, and the placement code imports spec.
    if name == "plan_fleet":
        from inferplane.planner.build import plan_fleet

        return plan_fleet
    if name == "Plan":
        from inferplane.planner.plan import Plan

        return Plan
    raise AttributeError(name)
