"""The joint placement model with OR-Tools CP-SAT: shape, card share and GPUs in one solve.

One boolean per (model, option, GPU group): an option is a shape (GPU type, TP) at one of a
few card shares between the replica's minimum and its want (`Shape.share_steps`); groups
are the aligned TP blocks of each node (P13), on nodes of the model's GPU types (P12) and
allowed nodes. Replicas of one model are interchangeable, so they share their variables:
the options picked for a model add up to its replica count, and no GPU holds two of them
(symmetry the solver would otherwise have to explore). Constraints: per-GPU capacity in
card units with CUDA contexts (P01), exclusivity, co-location (each replica shares a GPU
with an instance of a partner model - or, when the partners have fewer replicas, that many
of them do).

The objective, lexicographic by weights, `min_gpus`: replicas meeting their demand; then
(binpack) fewest GPUs - or (spread) most GPUs; then demand held in total (percent per
replica, so a shortfall is spread); then fewest nodes and low indices. `utilize`: replicas
meeting their demand; models whose replicas are sized alike (one boolean per model, set
when it uses two options whose KV pools differ by more than `ALIKE_RATIO`); demand held;
then fewest GPUs, most nodes and low indices. Every replica placed is a hard constraint.

The greedy placement is the hint and the fallback: when greedy met every demand, only the
nodes greedy used are modelled; the solver's answer is kept only when it is at least as
good (`placement.quality`). Replicas that span nodes are greedy's (`solve_around_spanning`).

Determinism: one search worker, a fixed seed and a *deterministic* time limit
(`max_deterministic_time`), so the same fleet gives the same plan on any machine and load.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inferplane.planner.placement import (
    Choice,
    Item,
    Option,
    Placement,
    Slot,
    alike,
    node_groups,
    quality,
    unalike_models,
)

if TYPE_CHECKING:
    from ortools.sat.python.cp_model import CpModel, IntVar

MAX_OPTIONS = 60_000  # larger models are left to greedy (the time limit would be all build)
# When greedy already met every demand, the solver can only save GPUs: a smaller model size
# where that is worth the solve time (measured: benchmarks/plan_scale.py).
MAX_POLISH_OPTIONS = 5_000
HELD_SCALE = 10  # held demand in percent: permille // 10


@dataclass(frozen=True)
class _Var:
    model: str  # the class of interchangeable replicas
    option: Option
    choice: Choice
    demand: int  # card units on each GPU of the group
    met: int
    held: int  # percent of the demand held
    concurrency: float  # requests of max_model_len its KV pool holds (sizing alike)


def solve(
    items: list[Item],
    slots: list[Slot],
    greedy: Placement,
    *,
    time_limit_s: float,
    policy: str = "binpack",
    objective: str = "min_gpus",
) -> Placement | None:
    """A placement at least as good as `greedy`, or None when the solver found nothing
    better in time (or the problem is too large to model)."""
    if not items:
        return None
    from ortools.sat.python import cp_model  # heavy: only when a solve runs

    by_id = {item.id: item for item in items}
    greedy_q = quality(greedy, by_id, slots, policy, objective)
    perfect = not greedy.unplaced and greedy_q[1] == len(items)
    if objective == "utilize" and unalike_models(greedy, by_id, slots):
        perfect = False  # alike replicas may need nodes and shares greedy did not use
    used_nodes = {node for c in greedy.choices.values() for node, _ in c.groups()}
    modelled = [s for s in slots if s.node in used_nodes] if perfect else slots
    classes = _classes(items)
    # Greedy met every demand: only GPU counts can improve, and for those the smallest
    # share that meets the demand dominates every larger one.
    options = _vars(classes, modelled, meeting_only=perfect)
    limit = MAX_POLISH_OPTIONS if perfect else MAX_OPTIONS
    if options is None or len(options) > limit:
        why = "greedy met every demand and " if perfect else ""
        greedy.notes.append(
            f"solver skipped: {why}more than {limit} placement options; greedy result kept"
        )
        return None
    model = cp_model.CpModel()
    var = [model.new_bool_var(f"o{n}") for n in range(len(options))]
    by_class: dict[str, list[int]] = defaultdict(list)
    by_gpu: dict[tuple[str, int], list[int]] = defaultdict(list)
    for n, opt in enumerate(options):
        by_class[opt.model].append(n)
        for index in opt.choice.indices:
            by_gpu[(opt.choice.node, index)].append(n)
    first = {name: members[0] for name, members in classes.items()}
    for name, members in classes.items():
        if not by_class[name]:
            return None
        model.add(sum(var[n] for n in by_class[name]) == len(members))
    slot_of = {s.key: s for s in modelled}
    used = {key: model.new_bool_var(f"g{key[0]}:{key[1]}") for key in by_gpu}
    nodes = sorted({key[0] for key in by_gpu})
    node_used = {node: model.new_bool_var(f"n{node}") for node in nodes}
    for key, ns in by_gpu.items():
        model.add(sum(options[n].demand * var[n] for n in ns) <= slot_of[key].capacity_units)
        model.add(sum(var[n] for n in ns) <= len(ns) * used[key])
        model.add(sum(var[n] for n in ns) >= used[key])
        model.add_implication(used[key], node_used[key[0]])
        per_model: dict[str, list[int]] = defaultdict(list)
        for n in ns:
            per_model[options[n].model].append(n)
        for group in per_model.values():
            if len(group) > 1:
                model.add(sum(var[n] for n in group) <= 1)  # replicas never share a GPU
        for n in ns:
            if first[options[n].model].exclusive:
                others = [m for m in ns if options[m].model != options[n].model]
                if others:
                    model.add(sum(var[m] for m in others) == 0).only_enforce_if(var[n])
    for node in nodes:
        model.add_bool_or([used[k] for k in used if k[0] == node]).only_enforce_if(
            node_used[node])
    # Co-location: each replica shares a GPU with a partner, or (partners with fewer
    # replicas) `colocate_count` of them do: a boolean per option for "placed with one".
    joined: dict[str, list[IntVar]] = defaultdict(list)
    for n, opt in enumerate(options):
        partners_of = first[opt.model].colocate_with
        if not partners_of:
            continue
        partners = sorted({
            m for index in opt.choice.indices for m in by_gpu[(opt.choice.node, index)]
            if options[m].model in partners_of
        })
        with_one = model.new_bool_var(f"c{n}")
        model.add_implication(with_one, var[n])
        if partners:
            model.add_bool_or([var[m] for m in partners]).only_enforce_if(with_one)
        else:
            model.add(with_one == 0)
        joined[opt.model].append(with_one)
    for name, flags in joined.items():
        need = min(len(classes[name]), first[name].colocate_count)
        model.add(sum(flags) >= need)
    # A sharing group (GPUs linked by a multi-GPU instance; one pod on Kubernetes) holds
    # at most one replica of each model. Aligned groups nest, so the occupied multi-GPU
    # groups are exactly what links GPUs; chains of unaligned ones are checked afterwards.
    spanned: dict[tuple[str, tuple[int, ...]], list[int]] = defaultdict(list)
    for n, opt in enumerate(options):
        if len(opt.choice.indices) > 1:
            spanned[(opt.choice.node, opt.choice.indices)].append(n)
    repeated = [name for name, members in classes.items() if len(members) > 1]
    for (node, block), holders in spanned.items():
        linked = model.new_bool_var(f"l{node}:{block}")
        model.add_bool_or([var[n] for n in holders]).only_enforce_if(linked)
        for n in holders:
            model.add_implication(var[n], linked)
        for name in repeated:
            touching = sorted({m for i in block for m in by_gpu[(node, i)]
                               if options[m].model == name})
            if len(touching) > 1:
                model.add(sum(var[m] for m in touching) <= 1).only_enforce_if(linked)
    unalike = _alike_terms(model, classes, options, var) if objective == "utilize" else []
    position = {key: rank for rank, key in enumerate(sorted(used))}
    gpu_sign = 1 if policy == "binpack" else -1
    # Lexicographic by weights, least important first: each weight exceeds the whole range
    # of every term below it.
    if objective == "utilize":
        node_sign = -gpu_sign  # owned GPUs: spread over nodes before stacking on one
        terms = [
            (gpu_sign * sum(used.values()), len(position)),
            (-sum(opt.held * var[n] for n, opt in enumerate(options)), 100 * len(items)),
            (sum(unalike), len(classes)),
            (-sum(opt.met * var[n] for n, opt in enumerate(options)), len(items)),
        ]
        lowest = [(sum(position[key] * v for key, v in used.items()),
                   len(position) * (len(position) + 1) // 2),
                  (node_sign * sum(node_used.values()), len(nodes))]
    else:
        terms = [
            (-sum(opt.held * var[n] for n, opt in enumerate(options)), 100 * len(items)),
            (gpu_sign * sum(used.values()), len(position)),
            (-sum(opt.met * var[n] for n, opt in enumerate(options)), len(items)),
        ]
        lowest = [(sum(position[key] * v for key, v in used.items()),
                   len(position) * (len(position) + 1) // 2),
                  (gpu_sign * sum(node_used.values()), len(nodes))]
    # Below GPUs and nodes, above the indices: fewer GPUs per replica at equal held demand
    # (a small model takes TP > 1 only when that holds more of its demand).
    widths = sum(opt.option.shape.gpus * var[n] for n, opt in enumerate(options))
    lowest.insert(1, (widths, 8 * len(items)))
    weight = 1
    objective_expr: Any = 0
    for expr, span in [*lowest, *terms]:
        objective_expr += weight * expr
        weight *= 2 * span + 1  # a term may range over [-span, span]
    model.minimize(objective_expr)
    hinted = {(by_id[i].model, c) for i, c in greedy.choices.items()}
    for n, opt in enumerate(options):
        model.add_hint(var[n], 1 if (opt.model, opt.choice) in hinted else 0)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    solver.parameters.max_deterministic_time = max(0.1, time_limit_s)
    # Wall-clock backstop only, far above what the deterministic limit takes even on a
    # saturated machine: hitting it would make the plan depend on load.
    solver.parameters.max_time_in_seconds = 60.0 + 30 * time_limit_s
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    result = Placement(solver="cp-sat", optimal=status == cp_model.OPTIMAL)
    picked: dict[str, list[Choice]] = defaultdict(list)
    order = {node: i for i, node in enumerate(dict.fromkeys(s.node for s in slots))}
    for n, opt in enumerate(options):
        if solver.boolean_value(var[n]):
            picked[opt.model].append(opt.choice)
    for name, members in classes.items():
        chosen = sorted(picked[name], key=lambda c: (order[c.node], c.indices, -c.units))
        for item, choice in zip(members, chosen, strict=True):
            result.choices[item.id] = choice
    if (quality(result, by_id, slots, policy, objective) < greedy_q
            or not replicas_apart(result, by_id)):
        return None
    return result


def replicas_apart(placement: Placement, items: dict[str, Item]) -> bool:
    """No group of GPUs linked by sharing holds two replicas of one model."""
    on_gpu: dict[tuple[str, int], list[str]] = defaultdict(list)
    for item_id, choice in placement.choices.items():
        for key in choice.gpus():
            on_gpu[key].append(item_id)
    seen: set[tuple[str, int]] = set()
    for start in on_gpu:
        if start in seen:
            continue
        members: set[str] = set()
        frontier = [start]
        seen.add(start)
        while frontier:
            key = frontier.pop()
            for item_id in on_gpu[key]:
                if item_id in members:
                    continue
                members.add(item_id)
                for other in placement.choices[item_id].gpus():
                    if other not in seen:
                        seen.add(other)
                        frontier.append(other)
        models = [items[i].model for i in members]
        if len(models) != len(set(models)):
            return False
    return True


def solve_around_spanning(
    items: list[Item],
    slots: list[Slot],
    greedy: Placement,
    *,
    time_limit_s: float,
    policy: str = "binpack",
    objective: str = "min_gpus",
) -> Placement | None:
    """`solve` for everything but the replicas greedy placed across nodes, which are kept
    as they are (with their GPUs taken out of the problem)."""
    fixed = {item_id: c for item_id, c in greedy.choices.items() if c.spans_nodes}
    spanning = {i.id for i in items if i.spans_nodes}
    if not fixed and not spanning:
        return solve(items, slots, greedy, time_limit_s=time_limit_s, policy=policy,
                     objective=objective)
    if spanning - set(fixed):
        return None  # a spanning replica did not fit: nothing to gain for the others
    taken = {key for choice in fixed.values() for key in choice.gpus()}
    rest = Placement(
        choices={k: c for k, c in greedy.choices.items() if k not in fixed},
        unplaced=list(greedy.unplaced), notes=greedy.notes, solver=greedy.solver,
        optimal=greedy.optimal,
    )
    solved = solve(
        [i for i in items if i.id not in fixed], [s for s in slots if s.key not in taken],
        rest, time_limit_s=time_limit_s, policy=policy, objective=objective,
    )
    if solved is None:
        return None
    solved.choices.update(fixed)
    return solved


def _alike_terms(
    model: CpModel, classes: dict[str, list[Item]], options: list[_Var], var: list[IntVar]
) -> list[IntVar]:
    """One boolean per model with several replicas, true when its replicas are not sized
    alike: the (shape, share) options it uses include two whose KV pools differ by more
    than ALIKE_RATIO."""
    flags: list[IntVar] = []
    for name, members in classes.items():
        if len(members) < 2:
            continue
        keyed: dict[tuple[str, int, int, int], list[int]] = defaultdict(list)
        held: dict[tuple[str, int, int, int], float] = {}
        for n, opt in enumerate(options):
            if opt.model == name:
                key = (opt.choice.gpu_type, opt.option.shape.tensor_parallel_size,
                       opt.option.shape.pipeline_parallel_size, opt.option.units)
                keyed[key].append(n)
                held[key] = opt.concurrency
        if len(keyed) < 2:
            continue
        picked = {}
        for key, ns in keyed.items():
            chosen = model.new_bool_var(f"k{name}:{key}")
            for n in ns:
                model.add_implication(var[n], chosen)
            picked[key] = chosen
        flag = model.new_bool_var(f"u{name}")
        keys = sorted(keyed)
        for i, a in enumerate(keys):
            for b in keys[i + 1:]:
                if not alike([held[a], held[b]]):
                    model.add(picked[a] + picked[b] <= 1 + flag)
        flags.append(flag)
    return flags


def _shares(item: Item, gpu_type: str, meeting_only: bool) -> list[Option]:
    options = item.options(gpu_type)
    if not meeting_only:
        return options
    out: list[Option] = []
    for shape in item.shapes[gpu_type]:
        meeting = [o for o in options if o.shape is shape and shape.meets(o.units)]
        if meeting:
            out.append(min(meeting, key=lambda o: o.units))
    return out


def _classes(items: list[Item]) -> dict[str, list[Item]]:
    """Replicas of one model, in replica order (they are interchangeable)."""
    classes: dict[str, list[Item]] = defaultdict(list)
    for item in sorted(items, key=lambda i: (i.order, i.replica)):
        classes[item.model].append(item)
    return dict(classes)


def _vars(
    classes: dict[str, list[Item]], slots: list[Slot], *, meeting_only: bool = False
) -> list[_Var] | None:
    per_node: dict[tuple[str, str], list[Slot]] = defaultdict(list)
    for slot in slots:
        per_node[(slot.node, slot.gpu_type)].append(slot)
    out: list[_Var] = []
    for name, members in classes.items():
        item = members[0]
        for (node, gpu_type), node_slots in per_node.items():
            if gpu_type not in item.shapes or (item.nodes is not None and node not in item.nodes):
                continue
            total = node_slots[0].total_bytes
            for option in _shares(item, gpu_type, meeting_only):
                shape = option.shape
                if shape.pipeline_parallel_size > 1:
                    continue  # spanning replicas are greedy's (solve_around_spanning)
                demand = option.demand(total)
                if demand > node_slots[0].capacity_units:
                    continue
                met = 1 if shape.meets(option.units) else 0
                held = shape.held_permille(option.units, total) // HELD_SCALE
                concurrency = shape.concurrency_at(option.units, total)
                for group, aligned in node_groups(node_slots, shape.tensor_parallel_size):
                    if aligned:
                        out.append(_Var(name, option, Choice(gpu_type, node, group,
                                                             units=option.units),
                                        demand, met, held, concurrency))
            if len(out) > MAX_OPTIONS:
                return None
    return out
