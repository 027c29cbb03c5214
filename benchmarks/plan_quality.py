"""Planner quality against the brute-force reference on generated small fleets.

For each seeded random fleet (1-3 nodes, <= 8 GPUs, <= 5 models with replicas, embeddings,
node pins, exclusive, colocate_with, explicit and default max_num_seqs, TP and utilization
pins) it plans with greedy only, with the full planner (greedy + CP-SAT), and runs the
exhaustive reference (tests/placement_oracle.py). Printed: refusals of fleets the
reference places, demands met, GPUs at equal demands, and a lower bound on GPUs
(ceil of the minimum shares' sum).

    .venv/bin/python benchmarks/plan_quality.py [--fleets 2000] [--seed 0] [--policy binpack]
"""

from __future__ import annotations

import argparse
import math
import random
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
from inferplane.planner.placement import Item, Placement, Slot, quality  # noqa: E402
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


def random_fleet(rng: random.Random) -> FleetSpec | None:
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
    for name in names:
        placement = []
        if rng.random() < 1 / 6:
            placement.append("exclusive: true")
        if rng.random() < 0.2:
            placement.append(f"node: node-{rng.randrange(len(nodes))}")
        others = [n for n in names if n != name]
        if others and rng.random() < 0.2:
            placement.append(f"colocate_with: [{rng.choice(others)}]")
        entry = (f"  - {{name: {name}, source: {POOL[name]}, replicas: {rng.choice([1, 1, 2])},"
                 f" max_model_len: {rng.choice([2048, 8192, 16384])},"
                 f" tensor_parallel_size: {rng.choice(['auto', 'auto', 'auto', 1])},"
                 f" gpu_memory_utilization: {rng.choice(['auto'] * 5 + [0.3])},"
                 f" placement: {{{', '.join(placement)}}}")
        seqs = rng.choice([None, 4, 16, 64])
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


def _met_of(placement: Placement, items: list[Item], slots: list[Slot]) -> tuple[int, int]:
    q = quality(placement, {i.id: i for i in items}, slots)
    return q[1], -q[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fleets", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policy", choices=["binpack", "spread"], default="binpack")
    parser.add_argument("--time-limit-s", type=float, default=2.0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    profiles = {n: load_profile(MODELS / d) for n, d in POOL.items()}
    counts = dict.fromkeys(
        ["fleets", "sizing refuses", "oracle too big", "oracle places", "oracle refuses"], 0)
    rows = {name: dict.fromkeys(["refused what fits", "fewer met", "more GPUs at equal met",
                                 "demands met", "GPUs"], 0) for name in ("greedy", "planner")}
    oracle_met = oracle_gpus = bound = 0
    started = time.perf_counter()
    while counts["fleets"] < args.fleets:
        spec = random_fleet(rng)
        if spec is None:
            continue
        counts["fleets"] += 1
        try:
            slots, items, _, _ = placement_problem(spec, profiles=profiles)
        except InferplaneError:
            counts["sizing refuses"] += 1
            continue
        try:
            oracle = best_placement(items, slots, budget=2_000_000)
        except TooBig:
            counts["oracle too big"] += 1
            continue
        if oracle is None:
            counts["oracle refuses"] += 1
            continue
        counts["oracle places"] += 1
        oracle_met += oracle.met
        oracle_gpus += oracle.gpus
        bound += _lower_bound(items, slots)
        greedy = place_greedy(items, slots, args.policy)
        results: dict[str, tuple[bool, int, int]] = {
            "greedy": (not greedy.unplaced, *_met_of(greedy, items, slots))}
        try:
            plan = plan_fleet(spec, profiles=profiles, policy=args.policy,  # type: ignore[arg-type]
                              time_limit_s=args.time_limit_s)
            by_model = {i.model: i for i in items}
            met = sum(by_model[p.model].shape(p.gpu_type, p.tensor_parallel_size).meets(
                round(p.gpu_memory_utilization * UNITS)) for p in plan.instances)
            results["planner"] = (True, met, plan.totals.gpus_used)
        except InferplaneError:
            results["planner"] = (False, 0, 0)
        for name, (placed, met, gpus) in results.items():
            row = rows[name]
            if not placed:
                row["refused what fits"] += 1
                continue
            row["demands met"] += met
            row["GPUs"] += gpus
            row["fewer met"] += met < oracle.met
            row["more GPUs at equal met"] += met == oracle.met and gpus > oracle.gpus
    seconds = time.perf_counter() - started
    console = Console()
    summary = Table(title=f"{counts['fleets']} generated fleets (seed {args.seed}, "
                          f"{args.policy}, {seconds:.0f} s)")
    for key in counts:
        summary.add_column(key, justify="right")
    summary.add_row(*(str(v) for v in counts.values()))
    console.print(summary)
    table = Table(title="on the fleets the oracle places")
    for column in ("placer", "refused what fits", "fewer met", "more GPUs at equal met",
                   "demands met", "GPUs"):
        table.add_column(column, justify="right")
    table.add_row("oracle (exhaustive)", "0", "0", "0", str(oracle_met), str(oracle_gpus))
    for name, row in rows.items():
        table.add_row(name, *(str(v) for v in row.values()))
    table.add_row("lower bound", "", "", "", "", str(bound))
    console.print(table)


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
