"""First-fit-decreasing placement: fast, deterministic, and the solver's seed and fallback.

Items go largest first (GPUs of their smallest shape, then card share); models that ask to
be co-located go after the models they join. Each item takes an `Option` (a shape - GPU
type and TP - at a card share) and the best feasible GPU group for it:

* one node and one GPU type per TP group (P12), aligned NVLink/switch blocks before
  unaligned ones (P13);
* `binpack` (default, P15): reuse partly used GPUs and nodes, best fit on what is left,
  so whole nodes stay free for 8-GPU models; `spread`: the least loaded GPUs and nodes;
* hints: `placement.node`, `placement.gpu_type` (via the item's shapes), `exclusive`
  (nothing else on its GPUs), `colocate_with` (shares a GPU with one of those models -
  as many replicas as the partners have; the rest go where they fit);
* two replicas of one model never share a GPU (a replica is for availability), nor a
  sharing group: GPUs linked by instances that share them (one pod on Kubernetes);
* a replica that spans nodes (pipeline stages) takes one TP group of empty GPUs on each of
  `pipeline_parallel_size` distinct nodes of one GPU type - the best-scoring nodes, ranks
  in inventory order - and nothing else is placed on those GPUs afterwards (P15).

Two passes, the better one kept (`placement.quality`): *demand first* gives each item the
cheapest option that meets its demand (else the one holding most of it); *minimum first*
packs every item at its minimum share (so nothing is refused for want of room another
model could give up), then upgrades items to options that meet their demand, cheapest
upgrade first.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

from inferplane.planner.placement import (
    Choice,
    Item,
    Option,
    Placement,
    Slot,
    node_groups,
    quality,
)
from inferplane.spec.model import PlacementSpec

Policy = str  # "binpack" | "spread"
Score = tuple[int | float, ...]


class PackState:
    """Occupancy of every GPU while placing."""

    def __init__(self, slots: list[Slot]) -> None:
        self.slots = {s.key: s for s in slots}
        self.used: dict[tuple[str, int], int] = dict.fromkeys(self.slots, 0)
        self.occupants: dict[tuple[str, int], list[Item]] = {k: [] for k in self.slots}
        self.node_used: dict[str, int] = defaultdict(int)
        groups: dict[tuple[str, str], list[Slot]] = defaultdict(list)
        for slot in slots:
            groups[(slot.node, slot.gpu_type)].append(slot)
        self.groups = groups
        self.node_order = {node: i for i, node in enumerate(dict.fromkeys(s.node for s in slots))}
        self.sealed: set[tuple[str, int]] = set()  # GPUs of replicas that span nodes
        self.demands: dict[str, int] = {}  # item id -> units it takes per GPU
        self.placed: dict[str, Choice] = {}
        self.prefer_empty = False  # binpack scoring, but an empty GPU before a shared one

    def fits(self, item: Item, node: str, index: int, demand: int) -> bool:
        key = (node, index)
        if key in self.sealed or self.used[key] + demand > self.slots[key].capacity_units:
            return False
        occupants = self.occupants[key]
        if not occupants:
            return True
        if item.exclusive:
            return False
        return not any(o.exclusive or o.model == item.model for o in occupants)

    def joins_partner(self, item: Item, node: str, indices: tuple[int, ...]) -> bool:
        if not item.must_colocate:
            return True
        return any(
            o.model in item.colocate_with for i in indices for o in self.occupants[(node, i)]
        )

    def keeps_replicas_apart(self, item: Item, node: str, indices: tuple[int, ...]) -> bool:
        """Whether the GPUs linked by sharing (one pod on Kubernetes) would still hold at
        most one replica of each model once `item` takes `indices`."""
        if not any(self.occupants[(node, i)] for i in indices):
            return True
        linked = set(indices)
        members: dict[str, Item] = {item.id: item}
        frontier = list(indices)
        while frontier:
            index = frontier.pop()
            for other in self.occupants[(node, index)]:
                if other.id in members:
                    continue
                members[other.id] = other
                for key in self.placed[other.id].gpus():
                    if key[0] == node and key[1] not in linked:
                        linked.add(key[1])
                        frontier.append(key[1])
        models = [m.model for m in members.values()]
        return len(models) == len(set(models))

    def is_empty_node(self, node: str, node_slots: list[Slot]) -> bool:
        return self.node_used[node] == 0 and not any(
            self.occupants[s.key] for s in node_slots
        )

    def place(self, item: Item, choice: Choice, demand: int) -> None:
        for key in choice.gpus():
            if not self.occupants[key]:
                self.node_used[key[0]] += 1
            self.used[key] += demand
            self.occupants[key].append(item)
            if choice.spans_nodes:
                self.sealed.add(key)
        self.demands[item.id] = demand
        self.placed[item.id] = choice

    def remove(self, item: Item, choice: Choice) -> None:
        demand = self.demands.pop(item.id)
        del self.placed[item.id]
        for key in choice.gpus():
            self.used[key] -= demand
            self.occupants[key] = [o for o in self.occupants[key] if o.id != item.id]
            if not self.occupants[key]:
                self.node_used[key[0]] -= 1

    def anchors_colocated(self, item: Item, choice: Choice) -> bool:
        """Whether a co-located replica on these GPUs relies on `item` as its partner."""
        for key in choice.gpus():
            for other in self.occupants[key]:
                if item.model not in other.colocate_with or not other.must_colocate:
                    continue
                partners = [o for k in choice.gpus() for o in self.occupants[k]
                            if o.model in other.colocate_with and o.id != item.id]
                if not partners:
                    return True
        return False


def item_order(items: Iterable[Item]) -> list[Item]:
    def key(item: Item) -> tuple[int, int, int, int, int]:
        tp, units = item.size_key()
        return (1 if item.colocate_with else 0, -tp, -units, item.order, item.replica)

    return sorted(items, key=key)


def place_greedy(
    items: list[Item],
    slots: list[Slot],
    policy: Policy = "binpack",
    fixed: dict[str, Choice] | None = None,
    objective: str = "min_gpus",
    prefer_empty: bool = False,
) -> Placement:
    """Place `items`; those in `fixed` (running instances) keep their choice and are only
    accounted for (incremental placement never moves them); `prefer_empty`: an empty GPU
    before a shared one (the least contended card). `objective` "utilize" then
    raises the replicas short of their demand onto the GPUs left free, a step at a time
    in turn (so replicas of one model grow alike)."""
    fixed = fixed or {}
    by_id = {item.id: item for item in items}
    demand_first = _pass(items, slots, policy, upgrade=False, fixed=fixed, objective=objective,
                         prefer_empty=prefer_empty)
    if not demand_first.unplaced and all(
        by_id[i].shape(c.gpu_type, c.tp).meets(c.units) for i, c in demand_first.choices.items()
    ):
        return demand_first
    minimum_first = _pass(items, slots, policy, upgrade=True, fixed=fixed, objective=objective,
                          prefer_empty=prefer_empty)
    if (quality(minimum_first, by_id, slots, policy, objective)
            > quality(demand_first, by_id, slots, policy, objective)):
        return minimum_first
    return demand_first


def _pass(
    items: list[Item], slots: list[Slot], policy: Policy, *, upgrade: bool,
    fixed: dict[str, Choice], objective: str = "min_gpus", prefer_empty: bool = False,
) -> Placement:
    state = PackState(slots)
    state.prefer_empty = prefer_empty
    placement = Placement(solver="greedy")
    type_bytes = {s.gpu_type: s.total_bytes for s in slots}
    for item in items:
        if item.id in fixed:
            choice = fixed[item.id]
            shape = item.shape(choice.gpu_type, choice.tp)
            state.place(item, choice, choice.units + shape.outside_units_for(
                type_bytes[choice.gpu_type]))
            placement.choices[item.id] = choice
    ordered = item_order(i for i in items if i.id not in fixed)
    for item in ordered:  # spanning replicas first: they need whole empty nodes
        if item.spans_nodes:
            _place(state, placement, item, type_bytes, policy, _by_demand)
    for item in ordered:
        if not item.spans_nodes:
            _place(state, placement, item, type_bytes, policy,
                   _by_minimum if upgrade else _by_demand)
    if upgrade:
        _upgrade(state, placement, ordered, type_bytes, policy)
    if objective == "utilize":
        _raise_held(state, placement, [i for i in ordered if i.id not in fixed], type_bytes,
                    policy)
    for item_id, choice in placement.choices.items():
        if item_id in fixed:
            continue
        for node, indices in choice.groups():
            if len(indices) > 1 and not _aligned(indices):
                placement.notes.append(
                    f"P13: {item_id} runs TP {len(indices)} on unaligned GPUs "
                    f"{list(indices)} of {node}; they may sit under different PCIe switches"
                )
    return placement


OptionKey = Callable[[Option, int], tuple[int, ...]]


def _by_demand(option: Option, type_rank: int) -> tuple[int, ...]:
    """Options that meet the demand first (fewest GPUs, then least share), then the ones
    holding most of it."""
    shape = option.shape
    if shape.meets(option.units):
        return (0, shape.gpus, option.units, type_rank)
    return (1, shape.gpus, -option.units, type_rank)


def _by_minimum(option: Option, type_rank: int) -> tuple[int, ...]:
    return (option.shape.gpus, option.units, type_rank)


def _options(item: Item, type_bytes: dict[str, int], key: OptionKey) -> list[Option]:
    types = sorted((t for t in item.shapes if t in type_bytes), key=lambda t: (type_bytes[t], t))
    ranked = [(key(o, rank), n, o) for rank, t in enumerate(types)
              for n, o in enumerate(item.options(t))]
    return [o for _, _, o in sorted(ranked, key=lambda r: (r[0], r[1]))]


def _place(
    state: PackState,
    placement: Placement,
    item: Item,
    type_bytes: dict[str, int],
    policy: Policy,
    key: OptionKey,
    only: Choice | None = None,
) -> bool:
    """Give `item` the first option (in `key` order) with a feasible group; `only`: keep
    it on those GPUs (a partner other replicas were co-located with)."""
    types = sorted(type_bytes, key=lambda t: (type_bytes[t], t))
    for option in _options(item, type_bytes, key):
        gpu_type = option.shape.gpu_type
        found = _best_group(state, item, option, types.index(gpu_type),
                            type_bytes[gpu_type], policy, only)
        if found is not None:
            state.place(item, found, option.demand(type_bytes[gpu_type]))
            placement.choices[item.id] = found
            if item.id in placement.unplaced:
                placement.unplaced.remove(item.id)
            return True
    if item.id not in placement.unplaced:
        placement.unplaced.append(item.id)
    return False


def _upgrade(
    state: PackState,
    placement: Placement,
    ordered: list[Item],
    type_bytes: dict[str, int],
    policy: Policy,
) -> None:
    """Move replicas placed at a share short of their demand to options that meet it,
    cheapest first (most replicas meeting their demand), then raise the rest as far as
    the cards allow."""
    def extra(item: Item) -> tuple[int, int, int]:
        choice = placement.choices[item.id]
        shape = item.shape(choice.gpu_type, choice.tp)
        return (shape.demand_units * shape.gpus - choice.units * choice.tp, item.order,
                item.replica)

    for key in (_by_demand, _by_held):
        pending = [i for i in ordered if i.id in placement.choices and not i.spans_nodes]
        pending = [i for i in pending if not _meets(i, placement.choices[i.id])]
        for item in sorted(pending, key=extra):
            current = placement.choices[item.id]
            demand = state.demands[item.id]
            state.remove(item, current)
            only = current if state.anchors_colocated(item, current) else None
            if not _place(state, placement, item, type_bytes, policy, key, only):
                state.place(item, current, demand)  # its old place is always still free
                placement.choices[item.id] = current
                placement.unplaced.remove(item.id)


MAX_RAISE_ROUNDS = 24  # share steps x TP sizes a replica may climb, with room to spare


def _raise_held(
    state: PackState,
    placement: Placement,
    ordered: list[Item],
    type_bytes: dict[str, int],
    policy: Policy,
) -> None:
    """`utilize`: while a replica short of its demand can hold more on what is free (a
    larger share, a wider TP), move it up by the smallest step; every short replica takes
    one step per round, the least held first, so replicas of one model grow alike."""
    types = sorted(type_bytes, key=lambda t: (type_bytes[t], t))

    def held(item: Item, option: Option) -> int:
        return option.shape.held_permille(option.units, type_bytes[option.shape.gpu_type])

    for _ in range(MAX_RAISE_ROUNDS):
        moved = False
        pending = [i for i in ordered if i.id in placement.choices and not i.spans_nodes
                   and not _meets(i, placement.choices[i.id])]
        now = {i.id: held(i, _option_of(i, placement.choices[i.id])) for i in pending}
        for item in sorted(pending, key=lambda i: (now[i.id], i.order, i.replica)):
            current = placement.choices[item.id]
            better = sorted(
                (held(item, o), o.shape.gpus, o.units, types.index(o.shape.gpu_type), n, o)
                for n, o in enumerate(o for t in types if t in item.shapes
                                      for o in item.options(t))
                if held(item, o) > now[item.id]
            )
            if not better:
                continue
            demand = state.demands[item.id]
            state.remove(item, current)
            only = current if state.anchors_colocated(item, current) else None
            for *_, option in better:
                gpu_type = option.shape.gpu_type
                found = _best_group(state, item, option, types.index(gpu_type),
                                    type_bytes[gpu_type], policy, only)
                if found is not None:
                    state.place(item, found, option.demand(type_bytes[gpu_type]))
                    placement.choices[item.id] = found
                    moved = True
                    break
            else:
                state.place(item, current, demand)  # its old place is always still free
        if not moved:
            return


def _option_of(item: Item, choice: Choice) -> Option:
    return Option(item.shape(choice.gpu_type, choice.tp), choice.units)


def _by_held(option: Option, type_rank: int) -> tuple[int, ...]:
    """The most share on the fewest GPUs (the rest of an unmet demand)."""
    return (option.shape.gpus, -option.units, type_rank)


def _meets(item: Item, choice: Choice) -> bool:
    return item.shape(choice.gpu_type, choice.tp).meets(choice.units)


def _best_group(
    state: PackState,
    item: Item,
    option: Option,
    type_rank: int,
    total_bytes: int,
    policy: Policy,
    only: Choice | None,
) -> Choice | None:
    shape = option.shape
    gpu_type, tp = shape.gpu_type, shape.tensor_parallel_size
    demand = option.demand(total_bytes)
    if shape.pipeline_parallel_size > 1:
        spanning = _spanning_choice(state, item, gpu_type, shape.pipeline_parallel_size, tp,
                                    demand, type_rank, policy)
        if spanning is None:
            return None
        choice = spanning[1]
        return Choice(gpu_type, choice.node, choice.indices, choice.ranks, option.units)
    if only is not None:  # the same GPUs, another share
        if gpu_type != only.gpu_type or tp != only.tp or not all(
            state.fits(item, only.node, i, demand) for i in only.indices
        ) or not state.keeps_replicas_apart(item, only.node, only.indices):
            return None
        return Choice(gpu_type, only.node, only.indices, units=option.units)
    best: tuple[Score, Choice] | None = None
    seen_empty: set[tuple[str, int]] = set()  # identical empty nodes: only the first
    for (node, node_type), node_slots in state.groups.items():
        if node_type != gpu_type or (item.nodes is not None and node not in item.nodes):
            continue
        if len(node_slots) < tp:
            continue
        if state.is_empty_node(node, node_slots):
            signature = (node_type, len(node_slots))
            if signature in seen_empty:
                continue
            seen_empty.add(signature)
        for group, aligned in _candidates(state, item, node, node_slots, tp, demand):
            if not state.joins_partner(item, node, group):
                continue
            if not state.keeps_replicas_apart(item, node, group):
                continue
            score = _score(state, node, group, aligned, type_rank, demand, policy)
            if best is None or score < best[0]:
                best = (score, Choice(gpu_type, node, group, units=option.units))
    return best[1] if best is not None else None


def _spanning_choice(
    state: PackState,
    item: Item,
    gpu_type: str,
    pp: int,
    tp: int,
    demand: int,
    type_rank: int,
    policy: Policy,
) -> tuple[Score, Choice] | None:
    """The best `pp` distinct nodes of `gpu_type` with a TP group of empty GPUs each."""
    per_node: list[tuple[Score, str, tuple[int, ...], bool]] = []
    for (node, node_type), node_slots in state.groups.items():
        if node_type != gpu_type or len(node_slots) < tp:
            continue
        if item.nodes is not None and node not in item.nodes:
            continue
        options = [
            (_score(state, node, group, aligned, type_rank, demand, policy), group, aligned)
            for group, aligned in node_groups(node_slots, tp)
            if all(not state.occupants[(node, i)] and state.fits(item, node, i, demand)
                   for i in group)
        ]
        if options:
            node_score, group, aligned = min(options)
            per_node.append((node_score, node, group, aligned))
    if len(per_node) < pp:
        return None
    chosen = sorted(per_node)[:pp]
    chosen.sort(key=lambda entry: state.node_order[entry[1]])
    unaligned = max(0 if entry[3] else 1 for entry in chosen)
    left = sum(sum(state.slots[(node, i)].capacity_units - state.used[(node, i)] - demand
                   for i in group) for _, node, group, _ in chosen)
    first = state.node_order[chosen[0][1]]
    score: Score
    if policy == "spread":
        load = sum(state.node_used[node] for _, node, _, _ in chosen)
        score = (unaligned, type_rank, 0, load, first)
    else:
        new_nodes = sum(1 for _, node, _, _ in chosen if state.node_used[node] == 0)
        score = (unaligned, tp * pp, type_rank, new_nodes, left, first)
    ranks = tuple((node, group) for _, node, group, _ in chosen)
    return score, Choice(gpu_type, ranks[0][0], ranks[0][1], ranks)


def _aligned(indices: tuple[int, ...]) -> bool:
    tp = len(indices)
    return indices[0] % tp == 0 and list(indices) == list(range(indices[0], indices[0] + tp))


def _candidates(
    state: PackState, item: Item, node: str, node_slots: list[Slot], tp: int, demand: int
) -> list[tuple[tuple[int, ...], bool]]:
    out = [
        (group, aligned)
        for group, aligned in node_groups(node_slots, tp)
        if all(state.fits(item, node, i, demand) for i in group)
    ]
    if not out and tp > 1:
        free = [s.index for s in node_slots if state.fits(item, node, s.index, demand)]
        if len(free) >= tp:
            out.append((tuple(sorted(free)[:tp]), False))
    return out


def _score(
    state: PackState,
    node: str,
    group: tuple[int, ...],
    aligned: bool,
    type_rank: int,
    demand: int,
    policy: Policy,
) -> Score:
    opened = sum(1 for i in group if not state.occupants[(node, i)])
    left = sum(state.slots[(node, i)].capacity_units - state.used[(node, i)] - demand
               for i in group)
    node_rank = state.node_order[node]
    if policy == "spread":
        load = sum(state.used[(node, i)] for i in group)
        return (0 if aligned else 1, type_rank, load, state.node_used[node], node_rank, *group)
    new_node = 1 if state.node_used[node] == 0 else 0
    if state.prefer_empty:
        load = sum(state.used[(node, i)] for i in group)
        return (0 if aligned else 1, len(group) - opened, load, type_rank, node_rank, *group)
    return (0 if aligned else 1, opened, type_rank, new_node, left, node_rank, *group)


def allowed_nodes(placement: PlacementSpec) -> frozenset[str] | None:
    return frozenset({placement.node}) if placement.node is not None else None
