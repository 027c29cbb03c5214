"""`planning:` — what the planner optimises once every replica is placed (docs/plan.md)."""

from __future__ import annotations

from typing import Literal

from inferplane.spec.base import SpecModel

# utilize: the GPUs are owned (a fixed inventory); use them to hold more of each replica's
# demand, replicas of one model sized alike. min_gpus: GPUs are rented (capacity planning,
# `inferplane capacity`); the fewest that meet the demands, a shortfall left short.
Objective = Literal["utilize", "min_gpus"]
OBJECTIVES: tuple[Objective, ...] = ("utilize", "min_gpus")


class PlanningSpec(SpecModel):
    """How the planner weighs GPUs against held demand."""

    objective: Objective = "utilize"
