"""The planner: place a fleet (pure functions). One instance's memory is the estimator's
(`inferplane.estimator`); vLLM's release facts are the engine adapter's
(`inferplane.engines.vllm.versions`, `.defaults`).

`from inferplane.planner import plan_fleet` places a fleet; `Plan` is its result;
`inferplane.planner.incremental` adds or removes replicas of a running plan.
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
