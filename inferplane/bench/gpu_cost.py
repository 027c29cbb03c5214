"""What a benchmarked model costs per hour: the price per GPU times the GPUs behind it.

A fleet file's plan says which cards serve the model (every replica, every node of a
replica that spans nodes); only those are charged, each at its type's price (or at
`--gpu-hour-usd`), whole cards even when shared with another model. A URL target hides
its GPUs, so the caller says how many (`--gpus`, default 1).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inferplane.bench.cost import GpuPrice
    from inferplane.planner.plan import Plan


@dataclass(frozen=True)
class TargetCost:
    usd_per_hour: float
    gpus: int
    counted: str  # which GPUs, in words: printed beside the price


def _cards(plan: Plan, models: Collection[str]) -> tuple[set[tuple[str, int, str]], int]:
    """(node, index, type) of every card serving `models`, and how many of them are shared
    with an instance of another model."""
    mine: set[tuple[str, int, str]] = set()
    others: set[tuple[str, int]] = set()
    for inst in plan.instances:
        placements = ([(r.node, r.gpu_indices) for r in inst.ranks] if inst.ranks
                      else [(inst.node, inst.gpu_indices)])
        for node, indices in placements:
            for index in indices:
                if inst.model in models:
                    mine.add((node, index, inst.gpu_type))
                else:
                    others.add((node, index))
    return mine, sum(1 for node, index, _ in mine if (node, index) in others)


def target_cost(
    plan: Plan | None, models: Collection[str], gpu_hour_usd: float | None,
    gpus: int | None, prices: dict[str, GpuPrice],
) -> TargetCost | None:
    """The hourly cost of the GPUs behind `models`, or None when no price is known."""
    names = ", ".join(sorted(models))
    if plan is None:
        if gpu_hour_usd is None:
            return None
        count = gpus or 1
        told = "--gpus" if gpus else "pass --gpus N for the GPUs behind the target"
        return TargetCost(gpu_hour_usd * count, count,
                          f"{count} GPU(s) x ${gpu_hour_usd:.2f}/h behind {names} ({told})")
    cards, shared = _cards(plan, models)
    if not cards:
        return None
    by_type = Counter(gpu_type for _, _, gpu_type in cards)
    total, parts = 0.0, []
    for gpu_type, count in sorted(by_type.items()):
        if gpu_hour_usd is not None:
            price = gpu_hour_usd
        elif gpu_type in prices:
            price = prices[gpu_type].usd_per_gpu_hour
        else:
            return None
        total += price * count
        parts.append(f"{count} x {gpu_type} at ${price:.2f}/h")
    nodes = sorted({node for node, _, _ in cards})
    where = f" on {', '.join(nodes)}"
    note = f"; {shared} shared with other models, counted whole" if shared else ""
    return TargetCost(total, len(cards),
                      f"{' + '.join(parts)}{where}: the GPUs behind {names}{note}")
