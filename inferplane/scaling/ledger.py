"""GPU-share arithmetic over the awake instances of a plan: does one more fit, who yields.

An awake instance holds `gpu_memory_utilization` of each of its cards (the plan's share);
a sleeping one holds next to nothing on the GPU (vLLM frees its weights and KV cache; the
CUDA context it keeps is inside the planner's per-card reserve). A card is full at the
plan's `card_budget_fraction`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from inferplane.planner.plan import PlanInstance

_EPS = 1e-6


def card_use(instances: Iterable[PlanInstance]) -> dict[tuple[str, int], float]:
    use: dict[tuple[str, int], float] = defaultdict(float)
    for inst in instances:
        for gpu in inst.gpu_indices:
            use[(inst.node, gpu)] += inst.gpu_memory_utilization
    return use


def fits(awake: Iterable[PlanInstance], candidate: PlanInstance, budget: float) -> bool:
    """Whether `candidate` can be awake next to `awake` on its own cards."""
    use = card_use(awake)
    return all(
        use[(candidate.node, gpu)] + candidate.gpu_memory_utilization <= budget + _EPS
        for gpu in candidate.gpu_indices
    )


def overlaps(a: PlanInstance, b: PlanInstance) -> bool:
    return a.node == b.node and bool(set(a.gpu_indices) & set(b.gpu_indices))


def freed_cards(instances: Iterable[PlanInstance], victim: PlanInstance) -> int:
    """How many of the victim's cards become empty when it goes (the most useful space)."""
    use = card_use(i for i in instances if i.id != victim.id)
    return sum(1 for gpu in victim.gpu_indices if use.get((victim.node, gpu), 0.0) <= _EPS)
