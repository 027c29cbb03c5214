"""A brute-force reference placer: slow, obviously correct, for small fleets only.

It takes the planner's own per-replica numbers (each `Item`'s shapes: TP, minimum, want and
demand shares, CUDA context) and searches every assignment of (shape, share, aligned GPU
group) to every replica, under the placement rules written out again here:

* a TP group is an aligned block of one node's GPUs of the shape's type (P12, P13), on an
  allowed node;
* per GPU: the sum of shares and CUDA contexts stays within the card budget (P01);
* two replicas of one model never share a GPU, nor a group of GPUs linked by instances
  that share them (one pod on Kubernetes); an exclusive replica's GPUs hold nothing
  else; a replica with `colocate_with` shares a GPU with an instance of one of those models.

Objectives, as the planner states them (`placement.quality`), over the packed shares:

* `min_gpus`: every replica placed, then the most replicas meeting their demand, then the
  fewest GPUs. Two shares per shape suffice there (the smallest that meets the demand, and
  the minimum: any other share only takes more room for the same score);
* `utilize`: every replica placed, the most replicas meeting their demand, the fewest
  models whose replicas are not sized alike (`placement.alike`), the most demand held
  (permille per replica), the fewest GPUs. Every share step is searched.

A `colocate_with` model needs a partner on the GPUs of as many of its replicas as the
partners have replicas (`Item.colocate_count`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from inferplane.planner.placement import Item, Slot, alike


class TooBig(Exception):
    """The search would take too long; the caller skips this fleet."""


@dataclass(frozen=True)
class OracleOption:
    gpus: tuple[tuple[str, int], ...]
    demand: int  # card units on each of them
    meets: bool
    label: str
    held: int = 0  # permille of the demand held
    concurrency: float = 0.0  # requests of max_model_len held (sizing alike)


@dataclass(frozen=True)
class OracleResult:
    met: int
    gpus: int
    assignment: dict[str, OracleOption]
    held: int = 0
    unalike: int = 0

    def score(self, objective: str) -> tuple[int, ...]:
        if objective == "utilize":
            return (self.met, -self.unalike, self.held, -self.gpus)
        return (self.met, -self.gpus)


def _groups(indices: list[int], tp: int) -> list[tuple[int, ...]]:
    ordered = sorted(indices)
    return [tuple(ordered[s:s + tp]) for s in range(0, len(ordered) - tp + 1, tp)]


def options_of(item: Item, slots: list[Slot], objective: str = "min_gpus"
               ) -> list[OracleOption]:
    by_node: dict[tuple[str, str], list[Slot]] = defaultdict(list)
    for slot in slots:
        by_node[(slot.node, slot.gpu_type)].append(slot)
    out: list[OracleOption] = []
    for (node, gpu_type), node_slots in sorted(by_node.items()):
        if gpu_type not in item.shapes or (item.nodes is not None and node not in item.nodes):
            continue
        total = node_slots[0].total_bytes
        for shape in item.shapes[gpu_type]:
            steps = shape.share_steps()
            meeting = [u for u in steps if shape.meets(u)]
            shares = {min(steps)} | ({min(meeting)} if meeting else set())
            if objective == "utilize":
                shares = set(steps)
            for units in sorted(shares):
                demand = units + shape.outside_units_for(total)
                for group in _groups([s.index for s in node_slots],
                                     shape.tensor_parallel_size):
                    out.append(OracleOption(
                        tuple((node, i) for i in group), demand, shape.meets(units),
                        f"{gpu_type} TP {shape.tensor_parallel_size} @{units} on {node}{group}",
                        shape.held_permille(units, total), shape.concurrency_at(units, total),
                    ))
    return out


def best_placement(items: list[Item], slots: list[Slot], *, budget: int = 300_000,
                   objective: str = "min_gpus") -> OracleResult | None:
    """The best assignment, or None when no assignment places every replica."""
    capacity = {s.key: s.capacity_units for s in slots}
    ordered = sorted(items, key=lambda i: (i.order, i.replica))
    options = [options_of(item, slots, objective) for item in ordered]
    used = dict.fromkeys(capacity, 0)
    holders: dict[tuple[str, int], list[Item]] = {k: [] for k in capacity}
    chosen: list[int] = []
    best: list[OracleResult] = []
    steps = [0]
    utilize = objective == "utilize"

    def colocation_ok() -> bool:
        joined: dict[str, int] = defaultdict(int)
        for k, (item, n) in enumerate(zip(ordered, chosen, strict=True)):
            if item.colocate_with and any(
                o.model in item.colocate_with for key in options[k][n].gpus
                for o in holders[key]
            ):
                joined[item.model] += 1
        for item in ordered:
            if item.colocate_with:
                count = sum(1 for i in ordered if i.model == item.model)
                if joined[item.model] < min(count, item.colocate_count):
                    return False
        return True

    def replicas_apart() -> bool:
        # GPUs linked by sharing (one pod on Kubernetes) hold one replica per model.
        linked: dict[tuple[str, int], set[tuple[str, int]]] = {k: {k} for k in capacity}
        for k, n in enumerate(chosen):
            gpus = options[k][n].gpus
            merged = set().union(*(linked[g] for g in gpus))
            for g in merged:
                linked[g] = merged
        for group in {frozenset(v) for v in linked.values()}:
            ids = {o.id for g in group for o in holders[g]}
            if len({o.model for g in group for o in holders[g]}) != len(ids):
                return False
        return True

    def unalike() -> int:
        held: dict[str, list[float]] = defaultdict(list)
        for k, n in enumerate(chosen):
            held[ordered[k].model].append(options[k][n].concurrency)
        return sum(1 for values in held.values() if not alike(values))

    def visit(depth: int, met: int, held: int) -> None:
        steps[0] += 1
        if steps[0] > budget:
            raise TooBig
        gpus = sum(1 for h in holders.values() if h)
        left = len(ordered) - depth
        if best:
            # an upper bound on what this branch can still reach (GPUs and unalike models
            # only grow as replicas are added)
            top = best[0].score(objective)
            if utilize:
                bound: tuple[int, ...] = (met + left, -unalike(), held + 1000 * left, -gpus)
            else:
                bound = (met + left, -gpus)
            if bound <= top:
                return
        if depth == len(ordered):
            if colocation_ok() and replicas_apart():
                result = OracleResult(met, gpus, {
                    item.id: options[k][n] for k, (item, n) in enumerate(zip(ordered, chosen,
                                                                               strict=True))
                }, held, unalike())
                best[:] = [result]
            return
        item = ordered[depth]
        previous = depth - 1
        start = 0
        if previous >= 0 and ordered[previous].model == item.model:
            start = chosen[previous] + 1  # replicas are interchangeable: ordered choices
        for n in range(start, len(options[depth])):
            option = options[depth][n]
            if not all(_fits(item, key, option.demand, used, capacity, holders)
                       for key in option.gpus):
                continue
            for key in option.gpus:
                used[key] += option.demand
                holders[key].append(item)
            chosen.append(n)
            visit(depth + 1, met + option.meets, held + option.held)
            chosen.pop()
            for key in option.gpus:
                used[key] -= option.demand
                holders[key].pop()

    visit(0, 0, 0)
    return best[0] if best else None


def _fits(
    item: Item,
    key: tuple[str, int],
    demand: int,
    used: dict[tuple[str, int], int],
    capacity: dict[tuple[str, int], int],
    holders: dict[tuple[str, int], list[Item]],
) -> bool:
    if used[key] + demand > capacity[key]:
        return False
    here = holders[key]
    if not here:
        return True
    if item.exclusive or any(o.exclusive for o in here):
        return False
    return all(o.model != item.model for o in here)
