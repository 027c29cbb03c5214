"""The card budget (P01) and what co-located instances are told.

`gpu_memory_utilization` is a fraction of the *whole* card, per process, and each process
also holds a CUDA context (~0.5 GiB) outside that fraction. On every GPU:

    sum(utilization of its instances) + sum(their outside-budget bytes) <= budget x card

Instances are packed at the card share placement chose for them (between their minimum
and their want); afterwards each grows toward its want, largest weights first, as far as
every card of its TP group allows - never beyond it.

Co-located instances also get an explicit KV pool (`--kv-cache-memory-bytes`, vLLM 0.11+):
vLLM sizes its pool from whole-device free-memory deltas, which another process on the card
distorts (vLLM issues 10643, 14376). The pool is the instance's share minus its non-KV
memory and vLLM's own 150 MiB redundancy buffer (`sizing.REDUNDANCY_BYTES`). They start one
after another, largest first (`start_after`), so each start-up check sees the memory the
earlier ones hold - before 0.11 (no such flag) that sequential start and the utilization
shares are what keep them apart.

Under the `utilize` objective replicas of one model are then sized alike: none keeps a KV
pool more than `placement.ALIKE_RATIO` above the smallest of its model's (what it gives up
is left to the other instances on its cards).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from inferplane.planner.placement import ALIKE_RATIO, Choice, Item, Slot


@dataclass(frozen=True)
class CardShare:
    units: int  # utilization in 1/10,000 of a card
    kv_cache_memory_bytes: int | None  # set when the instance shares a GPU
    shares_gpu_with: tuple[str, ...]
    start_after: tuple[str, ...]


def weights_rank(item: Item, choice: Choice) -> tuple[int, str]:
    return (-item.shape(choice.gpu_type, choice.tp).non_kv_bytes, item.id)


def share_cards(
    items: dict[str, Item],
    choices: dict[str, Choice],
    slots: list[Slot],
    frozen: frozenset[str] = frozenset(),
    *,
    kv_pool: bool = True,
    alike: bool = False,
) -> dict[str, CardShare]:
    """Every instance's share; `frozen` ones (running) keep theirs and do not grow.
    `kv_pool`: the engine takes `--kv-cache-memory-bytes` (vLLM 0.11+); `alike`: cap each
    replica's growth at ALIKE_RATIO times its model's smallest KV pool."""
    slot_of = {s.key: s for s in slots}
    on_gpu: dict[tuple[str, int], list[str]] = defaultdict(list)
    for item_id, choice in choices.items():
        for key in choice.gpus():
            on_gpu[key].append(item_id)
    units = {item_id: choice.units for item_id, choice in choices.items()}
    order = sorted(choices, key=lambda i: weights_rank(items[i], choices[i]))
    caps: dict[str, int] = {}
    for _ in range(2 if alike else 1):
        for item_id in order:
            if item_id in frozen:
                continue
            choice = choices[item_id]
            shape = items[item_id].shape(choice.gpu_type, choice.tp)
            room = min(
                _room(key, item_id, on_gpu, units, items, choices, slot_of)
                for key in choice.gpus()
            )
            top = min(shape.want_units, caps.get(item_id, shape.want_units))
            units[item_id] = max(units[item_id], min(top, room))
        if alike:
            caps = _alike_caps(items, choices, units, slot_of, frozen)
            for item_id, cap in caps.items():
                units[item_id] = min(units[item_id], cap)
    shares: dict[str, CardShare] = {}
    for item_id in sorted(choices):
        choice = choices[item_id]
        mates = sorted(
            {m for key in choice.gpus() for m in on_gpu[key] if m != item_id}
        )
        kv: int | None = None
        if mates and kv_pool:
            shape = items[item_id].shape(choice.gpu_type, choice.tp)
            total = slot_of[(choice.node, choice.indices[0])].total_bytes
            kv = shape.kv_bytes_at(units[item_id], total)
        before = tuple(
            m for m in mates
            if weights_rank(items[m], choices[m]) < weights_rank(items[item_id], choice)
        )
        shares[item_id] = CardShare(units[item_id], kv, tuple(mates), tuple(sorted(before)))
    return shares


def _alike_caps(
    items: dict[str, Item],
    choices: dict[str, Choice],
    units: dict[str, int],
    slot_of: dict[tuple[str, int], Slot],
    frozen: frozenset[str],
) -> dict[str, int]:
    """Per replica, the largest share that keeps its KV pool within ALIKE_RATIO of the
    smallest replica of its model (never below the share it was placed at)."""
    held: dict[str, dict[str, float]] = defaultdict(dict)
    for item_id, choice in choices.items():
        shape = items[item_id].shape(choice.gpu_type, choice.tp)
        total = slot_of[(choice.node, choice.indices[0])].total_bytes
        held[items[item_id].model][item_id] = shape.concurrency_at(units[item_id], total)
    caps: dict[str, int] = {}
    for replicas in held.values():
        if len(replicas) < 2:
            continue
        ceiling = ALIKE_RATIO * min(replicas.values())
        for item_id, value in replicas.items():
            if value <= ceiling or item_id in frozen:
                continue
            choice = choices[item_id]
            shape = items[item_id].shape(choice.gpu_type, choice.tp)
            total = slot_of[(choice.node, choice.indices[0])].total_bytes
            low, high = choice.units, units[item_id]  # the largest share at or under it
            while low < high:
                mid = (low + high + 1) // 2
                if shape.concurrency_at(mid, total) <= ceiling:
                    low = mid
                else:
                    high = mid - 1
            caps[item_id] = low
    return caps


def _room(
    key: tuple[str, int],
    item_id: str,
    on_gpu: dict[tuple[str, int], list[str]],
    units: dict[str, int],
    items: dict[str, Item],
    choices: dict[str, Choice],
    slot_of: dict[tuple[str, int], Slot],
) -> int:
    slot = slot_of[key]
    taken = 0
    for other in on_gpu[key]:
        shape = items[other].shape(choices[other].gpu_type, choices[other].tp)
        taken += shape.outside_units_for(slot.total_bytes)
        if other != item_id:
            taken += units[other]
    return slot.capacity_units - taken


def card_used_units(
    key: tuple[str, int],
    shares: dict[str, CardShare],
    items: dict[str, Item],
    choices: dict[str, Choice],
    total_bytes: int,
) -> int:
    """What the plan puts on one GPU, in card units (for checks and reports)."""
    used = 0
    for item_id, choice in choices.items():
        if key in choice.gpus():
            shape = items[item_id].shape(choice.gpu_type, choice.tp)
            used += shares[item_id].units + shape.outside_units_for(total_bytes)
    return used
