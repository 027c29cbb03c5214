"""The placement problem both placers solve: GPU slots, items to place, and an assignment.

A `Slot` is one physical GPU; an `Item` is one replica with a `Shape` per GPU type it may
use; a `Choice` is its GPU group on one node - or, for a shape with pipeline stages, one
group per node (`ranks`, rank 0 first; those GPUs hold nothing else). Capacities and
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
class Item:
    """One replica to place."""

    id: str
    model: str
    replica: int
    order: int  # position of the model in the fleet file
    shapes: dict[str, Shape]  # by GPU type
    nodes: frozenset[str] | None  # placement.node
    exclusive: bool
    colocate_with: tuple[str, ...]
    elastic: bool  # in a colocate_with relation: packed at its minimum, grown afterwards

    def demand(self, gpu_type: str, total_bytes: int) -> int:
        shape = self.shapes[gpu_type]
        base = shape.min_units if self.elastic else shape.want_units
        return base + shape.outside_units_for(total_bytes)

    def size_key(self) -> tuple[int, int]:
        """For first-fit-decreasing: GPUs per replica, then the largest demand."""
        tp = max(s.gpus for s in self.shapes.values())
        units = max(s.min_units if self.elastic else s.want_units for s in self.shapes.values())
        return tp, units


@dataclass(frozen=True)
class Choice:
    gpu_type: str
    node: str  # rank 0's node when the replica spans nodes
    indices: tuple[int, ...]  # rank 0's GPUs
    ranks: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (node, GPUs) per stage, PP > 1

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
