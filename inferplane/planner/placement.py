"""The placement problem both placers solve: GPU slots, items to place, and an assignment.

A `Slot` is one physical GPU; an `Item` is one replica with the `Shape`s it may take on
each GPU type it may use (every valid TP; each packed at one of a few card shares, an
`Option`); a `Choice` is its GPU group on one node and the share it was packed at - or,
for a shape with pipeline stages, one group per node (`ranks`, rank 0 first; those GPUs
hold nothing else). Capacities and
demands are integer units of 1/10,000 card (`sizing.UNITS`); an item's demand on each GPU
of its TP group is its utilization share plus its CUDA context (P01).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inferplane.planner.sizing import Shape


@dataclass(frozen=True)
class Slot:
    """One physical GPU."""

    node: str
    index: int  # NVML index on the node
    gpu_type: str
    total_bytes: int
    interconnect: str  # "nvlink" or "pcie"
    capacity_units: int  # the card budget
    uuid: str | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.node, self.index)


@dataclass(frozen=True)
class Option:
    """One way to run a replica: a shape (GPU type, TP) packed at a card share."""

    shape: Shape
    units: int  # utilization in 1/10,000 of a card

    def demand(self, total_bytes: int) -> int:
        """Card units it takes on each GPU of its group: the share plus the CUDA context."""
        return self.units + self.shape.outside_units_for(total_bytes)


@dataclass(frozen=True)
class Item:
    """One replica to place, with every shape it may take."""

    id: str
    model: str
    replica: int
    order: int  # position of the model in the fleet file
    shapes: dict[str, tuple[Shape, ...]]  # by GPU type, smallest TP first
    nodes: frozenset[str] | None  # placement.node
    exclusive: bool
    colocate_with: tuple[str, ...]
    # How many replicas of the model must share a GPU with a partner: all of them, or as
    # many as the partners have replicas (the rest go where they fit, P08 still holds).
    colocate_count: int = 1_000_000

    @property
    def must_colocate(self) -> bool:
        """Whether this replica needs a partner on its GPUs (the first `colocate_count`)."""
        return bool(self.colocate_with) and self.replica < self.colocate_count

    def shape(self, gpu_type: str, tp: int) -> Shape:
        for shape in self.shapes[gpu_type]:
            if shape.tensor_parallel_size == tp:
                return shape
        raise KeyError((self.id, gpu_type, tp))

    def options(self, gpu_type: str) -> list[Option]:
        """Every (shape, share) on `gpu_type`, largest share first per shape."""
        return [Option(shape, units) for shape in self.shapes[gpu_type]
                for units in shape.share_steps()]

    @property
    def spans_nodes(self) -> bool:
        return any(s.pipeline_parallel_size > 1 for shapes in self.shapes.values()
                   for s in shapes)

    def size_key(self) -> tuple[int, int]:
        """For first-fit-decreasing: GPUs of the smallest shape, then its largest share."""
        smallest = [shapes[0] for shapes in self.shapes.values()]
        return max(s.gpus for s in smallest), max(s.want_units for s in smallest)


@dataclass(frozen=True)
class Choice:
    gpu_type: str
    node: str  # rank 0's node when the replica spans nodes
    indices: tuple[int, ...]  # rank 0's GPUs
    ranks: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (node, GPUs) per stage, PP > 1
    units: int = 0  # the card share it was packed at (grown afterwards, colocation.py)

    @property
    def tp(self) -> int:
        return len(self.indices)

    @property
    def spans_nodes(self) -> bool:
        return len(self.ranks) > 1

    def groups(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """(node, GPU indices) of every node the replica uses, rank 0 first."""
        return self.ranks or ((self.node, self.indices),)

    def gpus(self) -> list[tuple[str, int]]:
        """Every (node, index) the replica uses."""
        return [(node, index) for node, indices in self.groups() for index in indices]


@dataclass
class Placement:
    """A (possibly partial) assignment of items to GPU groups."""

    choices: dict[str, Choice] = field(default_factory=dict)
    unplaced: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    solver: str = "greedy"
    optimal: bool = False

    def gpus_used(self) -> int:
        return len({key for c in self.choices.values() for key in c.gpus()})

    def nodes_used(self) -> int:
        return len({node for c in self.choices.values() for node, _ in c.groups()})


Quality = tuple[int, ...]
# Replicas of one model count as sized alike when the largest KV pool is at most this much
# above the smallest (requests of max_model_len held, so across TP sizes and GPU types).
ALIKE_RATIO = 1.25


def alike(held: list[float]) -> bool:
    """Whether replicas holding `held` requests each are sized alike (ALIKE_RATIO)."""
    return not held or max(held) <= ALIKE_RATIO * min(held) + 1e-9


def unalike_models(
    placement: Placement, items: dict[str, Item], slots: list[Slot]
) -> list[str]:
    """Models whose placed replicas are not sized alike, at their packed shares."""
    total = {s.key: s.total_bytes for s in slots}
    held: dict[str, list[float]] = {}
    for item_id, choice in placement.choices.items():
        item = items[item_id]
        shape = item.shape(choice.gpu_type, choice.tp)
        held.setdefault(item.model, []).append(
            shape.concurrency_at(choice.units, total[(choice.node, choice.indices[0])]))
    return sorted(m for m, values in held.items() if len(values) > 1 and not alike(values))


def quality(
    placement: Placement, items: dict[str, Item], slots: list[Slot], policy: str = "binpack",
    objective: str = "min_gpus",
) -> Quality:
    """The objective, better when larger: replicas placed, replicas meeting their demand,
    then

    * `min_gpus` (GPUs rented): (binpack) fewest GPUs, demand held in total (1/1,000 per
      replica), fewest nodes; (spread, which does not minimise GPUs) demand held. GPUs rank
      above demand held so a demand no shape can meet does not take every free GPU;
    * `utilize` (GPUs owned): models whose replicas are sized alike, demand held, then
      (binpack) fewest GPUs and most nodes: an owned GPU stays idle only when no replica
      would hold more with it."""
    total = {s.key: s.total_bytes for s in slots}
    met = held = 0
    for item_id, choice in placement.choices.items():
        shape = items[item_id].shape(choice.gpu_type, choice.tp)
        met += shape.meets(choice.units)
        held += shape.held_permille(choice.units, total[(choice.node, choice.indices[0])])
    placed = len(placement.choices)
    if objective == "utilize":
        unalike = len(unalike_models(placement, items, slots))
        if policy == "spread":
            return (placed, met, -unalike, held)
        return (placed, met, -unalike, held, -placement.gpus_used(), placement.nodes_used())
    if policy == "spread":
        return (placed, met, held)
    return (placed, met, -placement.gpus_used(), held, -placement.nodes_used())


def node_groups(slots: list[Slot], tp: int) -> list[tuple[tuple[int, ...], bool]]:
    """GPU groups of `tp` on one node's slots (same type), aligned blocks first.

    Aligned blocks ([0,1], [2,3] / [0..3], [4..7]) sit under one PCIe switch or NVLink
    domain on the usual 8-GPU boards (P13); the bool is False for unaligned fallbacks.
    """
    indices = sorted(s.index for s in slots)
    if tp == 1:
        return [((i,), True) for i in indices]
    out: list[tuple[tuple[int, ...], bool]] = []
    seen: set[tuple[int, ...]] = set()
    for start in range(0, len(indices) - tp + 1, tp):
        group = tuple(indices[start:start + tp])
        out.append((group, True))
        seen.add(group)
    for start in range(len(indices) - tp + 1):
        group = tuple(indices[start:start + tp])
        if group not in seen:
            out.append((group, False))
            seen.add(group)
    return out
