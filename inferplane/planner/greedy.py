"""First-fit-decreasing placement: fast, deterministic, and the solver's starting point.

Items go largest first (GPUs per replica, then card share); models that ask to be
co-located go after the models they join. Each item takes the best feasible GPU group:

* one node and one GPU type per TP group (P12), aligned NVLink/switch blocks before
  unaligned ones (P13);
* `binpack` (default, P15): reuse partly used GPUs and nodes, best fit on what is left,
  so whole nodes stay free for 8-GPU models; `spread`: the least loaded GPUs and nodes;
* hints: `placement.node`, `placement.gpu_type` (via the item's shapes), `exclusive`
  (nothing else on its GPUs), `colocate_with` (shares a GPU with one of those models);
* two replicas of one model never share a GPU (a replica is for availability);
* a replica that spans nodes (pipeline stages) takes one TP group of empty GPUs on each of
  `pipeline_parallel_size` distinct nodes of one GPU type - the best-scoring nodes, ranks
  in inventory order - and nothing else is placed on those GPUs afterwards (P15).
"""

from __future__ import annotations

from collections import defaultdict

from inferplane.planner.placement import Choice, Item, Placement, Slot, node_groups
from inferplane.spec.model import PlacementSpec

Policy = str  # "binpack" | "spread"


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
        if not item.colocate_with:
            return True
        return any(
            o.model in item.colocate_with for i in indices for o in self.occupants[(node, i)]
        )

    def place(self, item: Item, choice: Choice, demand: int) -> None:
        for key in choice.gpus():
            if not self.occupants[key]:
                self.node_used[key[0]] += 1
            self.used[key] += demand
            self.occupants[key].append(item)
            if choice.spans_nodes:
                self.sealed.add(key)


def item_order(items: list[Item]) -> list[Item]:
    def key(item: Item) -> tuple[int, int, int, int, int]:
        tp, units = item.size_key()
        return (1 if item.colocate_with else 0, -tp, -units, item.order, item.replica)

    return sorted(items, key=key)


def place_greedy(
    items: list[Item], slots: list[Slot], policy: Policy = "binpack"
) -> Placement:
    state = PackState(slots)
    placement = Placement(solver="greedy")
    type_bytes = {s.gpu_type: s.total_bytes for s in slots}
    for item in item_order(items):
        best: tuple[tuple[int | float, ...], Choice, int] | None = None
        types = sorted(
            (t for t in item.shapes if t in type_bytes), key=lambda t: (type_bytes[t], t)
        )
        for type_rank, gpu_type in enumerate(types):
            shape = item.shapes[gpu_type]
            tp = shape.tensor_parallel_size
            demand = item.demand(gpu_type, type_bytes[gpu_type])
            if shape.pipeline_parallel_size > 1:
                spanning = _spanning_choice(
                    state, item, gpu_type, shape.pipeline_parallel_size, tp, demand, type_rank,
                    policy,
                )
                if spanning is not None and (best is None or spanning[0] < best[0]):
                    best = (spanning[0], spanning[1], demand)
                continue
            for (node, node_type), node_slots in state.groups.items():
                if node_type != gpu_type or (item.nodes is not None and node not in item.nodes):
                    continue
                if len(node_slots) < tp:
                    continue
                for group, aligned in _candidates(state, item, node, node_slots, tp, demand):
                    if not state.joins_partner(item, node, group):
                        continue
                    score = _score(state, node, group, aligned, type_rank, demand, policy)
                    if best is None or score < best[0]:
                        best = (score, Choice(gpu_type, node, group), demand)
        if best is None:
            placement.unplaced.append(item.id)
            continue
        _, choice, demand = best
        state.place(item, choice, demand)
        placement.choices[item.id] = choice
        for node, indices in choice.groups():
            if len(indices) > 1 and not _aligned(indices):
                placement.notes.append(
                    f"P13: {item.id} runs TP {len(indices)} on unaligned GPUs "
                    f"{list(indices)} of {node}; they may sit under different "
                    "PCIe switches"
                )
    return placement


def _spanning_choice(
    state: PackState,
    item: Item,
    gpu_type: str,
    pp: int,
    tp: int,
    demand: int,
    type_rank: int,
    policy: Policy,
) -> tuple[tuple[int | float, ...], Choice] | None:
    """The best `pp` distinct nodes of `gpu_type` with a TP group of empty GPUs each."""
    per_node: list[tuple[tuple[int | float, ...], str, tuple[int, ...], bool]] = []
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
    score: tuple[int | float, ...]
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
) -> tuple[int | float, ...]:
    opened = sum(1 for i in group if not state.occupants[(node, i)])
    left = sum(state.slots[(node, i)].capacity_units - state.used[(node, i)] - demand
               for i in group)
    node_rank = state.node_order[node]
    if policy == "spread":
        load = sum(state.used[(node, i)] for i in group)
        return (0 if aligned else 1, type_rank, load, state.node_used[node], node_rank, *group)
    new_node = 1 if state.node_used[node] == 0 else 0
    return (0 if aligned else 1, opened, type_rank, new_node, left, node_rank, *group)


def allowed_nodes(placement: PlacementSpec) -> frozenset[str] | None:
    return frozenset({placement.node}) if placement.node is not None else None
