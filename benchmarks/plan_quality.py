"""Planner quality against the brute-force reference on generated small fleets.

For each seeded random fleet (1-3 nodes, <= 8 GPUs, <= 5 models with replicas, embeddings,
node pins, exclusive, colocate_with, explicit and default max_num_seqs, TP and utilization
pins) it plans with greedy only, with the full planner (greedy + CP-SAT), and runs the
exhaustive reference (tests/placement_oracle.py) under the same objective. Printed:
refusals of fleets the reference places, demands met, GPUs at equal demands, a lower bound
on GPUs (ceil of the minimum shares' sum), and for `utilize` the models not sized alike and
the demand held at equal demands met.

Fleet kinds (`--kind`): `classic` (the generator above), `unmeetable` (every generation
model asks 64-256 requests of 16-32K tokens: no shape meets them, the case where `min_gpus`
leaves owned GPUs idle), `pins` (models pinned to different nodes, partners co-located
across the pins), `all` (the three in turn).

    .venv/bin/python benchmarks/plan_quality.py [--fleets 2000] [--seed 0]
        [--policy binpack] [--objective utilize|min_gpus] [--kind all]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from placement_oracle import TooBig, best_placement  # noqa: E402

from inferplane.errors import InferplaneError  # noqa: E402
from inferplane.models import load_profile  # noqa: E402
from inferplane.planner import plan_fleet  # noqa: E402
from inferplane.planner.build import placement_problem  # noqa: E402
from inferplane.planner.greedy import place_greedy  # noqa: E402
from inferplane.planner.placement import Item, Placement, Slot, alike, quality  # noqa: E402
from inferplane.planner.plan import Plan  # noqa: E402
from inferplane.planner.sizing import UNITS  # noqa: E402
from inferplane.spec import FleetSpec, parse_fleet  # noqa: E402

MODELS = ROOT / "tests" / "data" / "models"
POOL = {
    "qwen3-8b": "Qwen--Qwen3-8B",
    "llama-8b": "meta-llama--Llama-3.1-8B",
    "qwen2-5-7b": "Qwen--Qwen2.5-7B-Instruct",
    "qwen3-32b": "Qwen--Qwen3-32B",
    "embed": "Qwen--Qwen3-Embedding-0.6B",
    "embed-b": "Qwen--Qwen3-Embedding-0.6B",
}
GPU_TYPES = ["L4", "L40S", "A100-80GB", "H100"]


def random_fleet(rng: random.Random, kind: str = "classic") -> FleetSpec | None:
    while True:
        nodes = [(rng.choice(GPU_TYPES), rng.choice([1, 2, 2, 4]))
                 for _ in range(rng.randint(1, 3))]
        if sum(c for _, c in nodes) <= 8:
            break
    names = rng.sample(sorted(POOL), rng.randint(1, 5))
    lines = ["gpus:", "  nodes:"]
    lines += [f"    - {{name: node-{i}, gpu_type: {g}, count: {c}}}"
              for i, (g, c) in enumerate(nodes)]
    lines.append("models:")
    pinned: dict[str, int] = {}
    for name in names:
        placement = []
        if rng.random() < 1 / 6:
            placement.append("exclusive: true")
        pin = rng.random() < (0.6 if kind == "pins" else 0.2)
        if pin:
            pinned[name] = rng.randrange(len(nodes))
            placement.append(f"node: node-{pinned[name]}")
        others = [n for n in names if n != name]
        if kind == "pins":  # partners pinned to another node than this model's
            others = [n for n in others if n in pinned and pinned[n] != pinned.get(name)]
        if others and rng.random() < (0.5 if kind == "pins" else 0.2):
            placement.append(f"colocate_with: [{rng.choice(others)}]")
        # the draws in the order of the classic generator, so its fleets stay the same
        replicas = rng.choice([1, 1, 2])
        length = rng.choice([2048, 8192, 16384])
        tp = rng.choice(["auto", "auto", "auto", 1])
        util = rng.choice(["auto"] * 5 + [0.3])
        seqs = rng.choice([None, 4, 16, 64])
        if kind == "unmeetable" and not name.startswith("embed"):
            length, seqs = rng.choice([16384, 32768]), rng.choice([64, 256])
        entry = (f"  - {{name: {name}, source: {POOL[name]}, replicas: {replicas},"
                 f" max_model_len: {length}, tensor_parallel_size: {tp},"
                 f" gpu_memory_utilization: {util}, placement: {{{', '.join(placement)}}}")
        if seqs is not None:
            entry += f", max_num_seqs: {seqs}"
        if name.startswith("embed"):
            entry += ", task: embed"
        lines.append(entry + "}")
    try:
        return parse_fleet("\n".join(lines) + "\n", filename=str(ROOT / "bench.yaml"),
                           base_dir=MODELS)
    except InferplaneError:
        return None  # e.g. colocate_with an exclusive model


def _score(placement: Placement, items: list[Item], slots: list[Slot], objective: str
           ) -> tuple[int, int, int, int]:
    """(met, GPUs, unalike models, held permille) of a placement at its packed shares."""
    q = quality(placement, {i.id: i for i in items}, slots, "binpack", objective)
    if objective == "utilize":
        return q[1], -q[4], -q[2], q[3]
    return q[1], -q[2], 0, q[3]


def _plan_score(plan: Plan, items: list[Item], slots: list[Slot]) -> tuple[int, int, int, int]:
    """The same for a Plan, at its final shares."""
    by_model = {i.model: i for i in items}
    card = {s.gpu_type: s.total_bytes for s in slots}
    met = held = 0
    concurrency: dict[str, list[float]] = {}
    for inst in plan.instances:
        shape = by_model[inst.model].shape(inst.gpu_type, inst.tensor_parallel_size)
        units = round(inst.gpu_memory_utilization * UNITS)
        met += shape.meets(units)
        held += shape.held_permille(units, card[inst.gpu_type])
        concurrency.setdefault(inst.model, []).append(
            shape.concurrency_at(units, card[inst.gpu_type]))
    unalike = sum(1 for values in concurrency.values() if not alike(values))
    return met, plan.totals.gpus_used, unalike, held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fleets", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policy", choices=["binpack", "spread"], default="binpack")
    parser.add_argument("--objective", choices=["utilize", "min_gpus"], default="min_gpus")
    parser.add_argument("--kind", choices=["classic", "unmeetable", "pins", "all"],
                        default="all")
    parser.add_argument("--time-limit-s", type=float, default=2.0)
    parser.add_argument("--oracle-budget", type=int, default=2_000_000)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    kinds = ["classic", "unmeetable", "pins"] if args.kind == "all" else [args.kind]
    profiles = {n: load_profile(MODELS / d) for n, d in POOL.items()}
    counts = dict.fromkeys(
        ["fleets", "sizing refuses", "oracle too big", "oracle places", "oracle refuses"], 0)
    columns = ["refused what fits", "fewer met", "more GPUs at equal met",
               "more unalike at equal met", "less held at equal met+alike", "demands met",
               "GPUs", "unalike", "held"]
    rows = {name: dict.fromkeys(columns, 0) for name in ("greedy", "planner")}
    oracle_sum = dict.fromkeys(["demands met", "GPUs", "unalike", "held"], 0)
    bound = 0
    plan_seconds: list[float] = []
    started = time.perf_counter()
    while counts["fleets"] < args.fleets:
        spec = random_fleet(rng, kinds[counts["fleets"] % len(kinds)])
        if spec is None:
            continue
        counts["fleets"] += 1
        try:
            slots, items, _, _ = placement_problem(spec, profiles=profiles)
        except InferplaneError:
            counts["sizing refuses"] += 1
            continue
        try:
            oracle = best_placement(items, slots, budget=args.oracle_budget,
                                    objective=args.objective)
        except TooBig:
            counts["oracle too big"] += 1
            continue
        if oracle is None:
            counts["oracle refuses"] += 1
            continue
        counts["oracle places"] += 1
        for key, value in zip(oracle_sum, (oracle.met, oracle.gpus, oracle.unalike,
                                           oracle.held), strict=True):
            oracle_sum[key] += value
        bound += _lower_bound(items, slots)
        greedy = place_greedy(items, slots, args.policy, objective=args.objective)
        results: dict[str, tuple[bool, tuple[int, int, int, int]]] = {
            "greedy": (not greedy.unplaced, _score(greedy, items, slots, args.objective))}
        try:
            t0 = time.perf_counter()
            plan = plan_fleet(spec, profiles=profiles, policy=args.policy,  # type: ignore[arg-type]
                              time_limit_s=args.time_limit_s,
                              objective=args.objective)  # type: ignore[arg-type]
            plan_seconds.append(time.perf_counter() - t0)
            results["planner"] = (True, _plan_score(plan, items, slots))
        except InferplaneError:
            results["planner"] = (False, (0, 0, 0, 0))
        for name, (placed, (met, gpus, unalike, held)) in results.items():
            row = rows[name]
            if not placed:
                row["refused what fits"] += 1
                continue
            row["demands met"] += met
            row["GPUs"] += gpus
            row["unalike"] += unalike
            row["held"] += held
            row["fewer met"] += met < oracle.met
            row["more GPUs at equal met"] += met == oracle.met and gpus > oracle.gpus
            if args.objective == "utilize":  # not what min_gpus optimises
                row["more unalike at equal met"] += (met == oracle.met
                                                     and unalike > oracle.unalike)
                row["less held at equal met+alike"] += (
                    met == oracle.met and unalike == oracle.unalike
                    and held < oracle.held - 10 * len(items))
    seconds = time.perf_counter() - started
    console = Console(width=max(Console().width, 160))
    summary = Table(title=f"{counts['fleets']} generated fleets (seed {args.seed}, "
                          f"{args.policy}, {args.objective}, kinds {'+'.join(kinds)}, "
                          f"{seconds:.0f} s)")
    for key in counts:
        summary.add_column(key, justify="right")
    summary.add_row(*(str(v) for v in counts.values()))
    console.print(summary)
    table = Table(title="on the fleets the oracle places (held: permille summed; the "
                        "planner's at its final shares, the others' at packed shares)")
    table.add_column("placer")
    for column in columns:
        table.add_column(column, justify="right")
    table.add_row("oracle (exhaustive)", "0", "0", "0", "0", "0",
                  *(str(v) for v in oracle_sum.values()))
    for name, row in rows.items():
        table.add_row(name, *(str(v) for v in row.values()))
    table.add_row("lower bound", "", "", "", "", "", "", str(bound), "", "")
    console.print(table)
    if plan_seconds:
        ordered = sorted(plan_seconds)
        console.print(
            f"plan_fleet wall time over {len(ordered)} plans: total {sum(ordered):.1f} s, "
            f"median {statistics.median(ordered) * 1000:.0f} ms, p95 "
            f"{ordered[int(0.95 * (len(ordered) - 1))] * 1000:.0f} ms, max "
            f"{ordered[-1] * 1000:.0f} ms")


def _lower_bound(items: list[Item], slots: list[Slot]) -> int:
    """GPUs no placement can beat: the minimum shares (with contexts) of every replica
    over the largest card budget."""
    capacity = max(s.capacity_units for s in slots)
    total = max(s.total_bytes for s in slots)
    need = 0
    for item in items:
        need += min(s.min_units * s.gpus + s.outside_units_for(total) * s.gpus
                    for shapes in item.shapes.values() for s in shapes)
    return math.ceil(need / capacity) if need else 0


if __name__ == "__main__":
    main()
