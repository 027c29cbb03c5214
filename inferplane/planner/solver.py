"""Exact/near-exact placement with OR-Tools CP-SAT: fewest GPUs, then fewest nodes touched.

The model: one boolean per (item, GPU group) option - groups are the aligned TP blocks of
each node (P13), on nodes of the item's GPU types (P12) and allowed nodes - with exactly
one option per item, per-GPU capacity in card units (P01), exclusivity, co-location and
"no two replicas of one model on a GPU". The greedy placement is the hint and the upper
bound: only the nodes greedy used (plus every node when greedy failed) are modelled, and
the solver's answer is kept only when it is at least as good.

Replicas that span nodes (pipeline stages) are not modelled: greedy places them first
(largest first) and `solve_around_spanning` hands the solver the other replicas and the
GPUs those left free.

Determinism: one search worker, a fixed seed and a *deterministic* time limit
(`max_deterministic_time`), so the same fleet gives the same plan on any machine.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ortools.sat.python import cp_model

from inferplane.planner.placement import Choice, Item, Placement, Slot, node_groups

MAX_OPTIONS = 60_000  # larger models are left to greedy (the time limit would be all build)


@dataclass(frozen=True)
class _Option:
    item: Item
    choice: Choice
    demand: int


def solve(
    items: list[Item],
    slots: list[Slot],
    greedy: Placement,
    *,
    time_limit_s: float,
) -> Placement | None:
    """A placement at least as good as `greedy`, or None when the solver found nothing
    better in time (or the problem is too large to model)."""
    if not items:
        return None
    used_nodes = {c.node for c in greedy.choices.values()}
    modelled = slots if greedy.unplaced else [s for s in slots if s.node in used_nodes]
    options = _options(items, modelled)
    if options is None:
        greedy.notes.append(
            f"solver skipped: more than {MAX_OPTIONS} placement options; greedy result kept"
        )
        return None
    model = cp_model.CpModel()
    var: dict[int, cp_model.IntVar] = {}
    by_item: dict[str, list[int]] = defaultdict(list)
    by_gpu: dict[tuple[str, int], list[int]] = defaultdict(list)
    for n, opt in enumerate(options):
        var[n] = model.new_bool_var(f"o{n}")
        by_item[opt.item.id].append(n)
        for index in opt.choice.indices:
            by_gpu[(opt.choice.node, index)].append(n)
    for item in items:
        if not by_item[item.id]:
            return None
        model.add_exactly_one(var[n] for n in by_item[item.id])
    slot_of = {s.key: s for s in modelled}
    used = {key: model.new_bool_var(f"g{key[0]}:{key[1]}") for key in by_gpu}
    nodes = sorted({key[0] for key in by_gpu})
    node_used = {node: model.new_bool_var(f"n{node}") for node in nodes}
    for key, ns in by_gpu.items():
        model.add(sum(options[n].demand * var[n] for n in ns) <= slot_of[key].capacity_units)
        model.add(sum(var[n] for n in ns) <= len(ns) * used[key])
        model.add_implication(used[key], node_used[key[0]])
        per_model: dict[str, list[int]] = defaultdict(list)
        for n in ns:
            per_model[options[n].item.model].append(n)
        for group in per_model.values():
            if len(group) > 1:
                model.add(sum(var[n] for n in group) <= 1)
        for n in ns:
            if options[n].item.exclusive:
                others = [m for m in ns if options[m].item.id != options[n].item.id]
                if others:
                    model.add(sum(var[m] for m in others) == 0).only_enforce_if(var[n])
    for n, opt in enumerate(options):
        if not opt.item.colocate_with:
            continue
        partners = {
            m for index in opt.choice.indices for m in by_gpu[(opt.choice.node, index)]
            if options[m].item.model in opt.item.colocate_with
        }
        if not partners:
            model.add(var[n] == 0)
        else:
            model.add_bool_or([var[m] for m in sorted(partners)]).only_enforce_if(var[n])
    # GPUs used, then nodes touched (P15), then low indices first (a stable, readable plan).
    position = {key: rank for rank, key in enumerate(sorted(used))}
    w_nodes = len(position) * (len(position) + 1) // 2 + 1
    w_gpus = (len(nodes) + 1) * w_nodes
    model.minimize(
        w_gpus * sum(used.values())
        + w_nodes * sum(node_used.values())
        + sum(position[key] * var for key, var in used.items())
    )
    for n, opt in enumerate(options):
        chosen = greedy.choices.get(opt.item.id)
        model.add_hint(var[n], 1 if chosen == opt.choice else 0)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    solver.parameters.max_deterministic_time = max(0.1, time_limit_s)
    solver.parameters.max_time_in_seconds = max(1.0, 4 * time_limit_s)  # backstop only
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    result = Placement(solver="cp-sat", optimal=status == cp_model.OPTIMAL)
    for n, opt in enumerate(options):
        if solver.boolean_value(var[n]):
            result.choices[opt.item.id] = opt.choice
    if not greedy.unplaced and _cost(result) > _cost(greedy):
        return None
    return result


def solve_around_spanning(
    items: list[Item],
    slots: list[Slot],
    greedy: Placement,
    *,
    time_limit_s: float,
) -> Placement | None:
    """`solve` for everything but the replicas greedy placed across nodes, which are kept
    as they are (with their GPUs taken out of the problem)."""
    fixed = {item_id: c for item_id, c in greedy.choices.items() if c.spans_nodes}
    if not fixed:
        return solve(items, slots, greedy, time_limit_s=time_limit_s)
    taken = {key for choice in fixed.values() for key in choice.gpus()}
    rest = Placement(
        choices={k: c for k, c in greedy.choices.items() if k not in fixed},
        unplaced=list(greedy.unplaced), notes=greedy.notes, solver=greedy.solver,
        optimal=greedy.optimal,
    )
    solved = solve(
        [i for i in items if i.id not in fixed], [s for s in slots if s.key not in taken],
        rest, time_limit_s=time_limit_s,
    )
    if solved is None:
        return None
    solved.choices.update(fixed)
    return solved


def _cost(placement: Placement) -> tuple[int, int]:
    nodes = {c.node for c in placement.choices.values()}
    return placement.gpus_used(), len(nodes)


def _options(items: list[Item], slots: list[Slot]) -> list[_Option] | None:
    per_node: dict[tuple[str, str], list[Slot]] = defaultdict(list)
    for slot in slots:
        per_node[(slot.node, slot.gpu_type)].append(slot)
    options: list[_Option] = []
    for item in items:
        for (node, gpu_type), node_slots in per_node.items():
            shape = item.shapes.get(gpu_type)
            if shape is None or (item.nodes is not None and node not in item.nodes):
                continue
            if shape.pipeline_parallel_size > 1:
                continue  # spanning replicas are greedy's (solve_around_spanning)
            tp = shape.tensor_parallel_size
            demand = item.demand(gpu_type, node_slots[0].total_bytes)
            if demand > node_slots[0].capacity_units:
                continue
            for group, aligned in node_groups(node_slots, tp):
                if aligned:
                    options.append(_Option(item, Choice(gpu_type, node, group), demand))
            if len(options) > MAX_OPTIONS:
                return None
    return options
