"""Planner scale and quality.

1. Scale: 1,000 GPUs (125 nodes of 8) and 300 model instances, planned end to end with
   `plan_fleet` (sizing, greedy, CP-SAT within its limit, argv/env, the Plan). Target: 5 s.
2. Quality: on generated fleets (seeded), GPUs used by greedy first-fit-decreasing, by
   CP-SAT, and a lower bound: ceil(sum of every instance's card share x TP / budget).

    .venv/bin/python benchmarks/plan_scale.py [--seed 0] [--fleets 12] [--time-limit-s 5]
"""

from __future__ import annotations

import argparse
import math
import random
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from inferplane.models import load_profile
from inferplane.models.profile import ModelProfile
from inferplane.planner.build import placement_problem, plan_fleet
from inferplane.planner.greedy import place_greedy
from inferplane.planner.solver import solve
from inferplane.spec import FleetSpec, parse_fleet

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "tests" / "data" / "models"

SCALE_MODELS = [  # (name, directory, extra fields), 30 replicas each = 300 instances
    ("qwen3-8b", "Qwen--Qwen3-8B", "max_model_len: 8192, max_num_seqs: 32"),
    ("llama-8b", "meta-llama--Llama-3.1-8B-Instruct", "max_model_len: 8192, max_num_seqs: 16"),
    ("mistral-7b", "mistralai--Mistral-7B-Instruct-v0.3", "max_model_len: 8192"),
    ("qwen2-5-7b", "Qwen--Qwen2.5-7B-Instruct", "max_model_len: 16384, max_num_seqs: 16"),
    ("gemma-2-9b", "google--gemma-2-9b-it", "max_model_len: 4096, max_num_seqs: 16"),
    ("qwen3-32b", "Qwen--Qwen3-32B", "max_model_len: 16384, max_num_seqs: 32"),
    ("qwen3-32b-fp8", "Qwen--Qwen3-32B-FP8", "max_model_len: 8192, max_num_seqs: 16"),
    ("llama-70b", "meta-llama--Llama-3.1-70B-Instruct", "max_model_len: 8192, max_num_seqs: 8"),
    ("embed", "Qwen--Qwen3-Embedding-0.6B",
     "task: embed, max_model_len: 2048, max_num_seqs: 8, gpu_memory_utilization: 0.2"),
    ("mixtral", "mistralai--Mixtral-8x7B-v0.1", "max_model_len: 8192, max_num_seqs: 8"),
]


def _fleet(nodes: list[tuple[str, int]], models: list[tuple[str, str, str, int]]) -> FleetSpec:
    lines = ["gpus:", "  nodes:"]
    lines += [
        f"    - {{name: node-{i}, gpu_type: {gpu}, count: {count}, interconnect: nvlink}}"
        for i, (gpu, count) in enumerate(nodes)
    ]
    lines.append("models:")
    lines += [
        f"  - {{name: {name}, source: {src}, replicas: {replicas}, {extra}}}"
        for name, src, extra, replicas in models
    ]
    return parse_fleet("\n".join(lines) + "\n", filename=str(ROOT / "bench.yaml"),
                       base_dir=MODELS)


def _profiles(models: list[tuple[str, str, str, int]]) -> dict[str, ModelProfile]:
    return {name: load_profile(MODELS / src) for name, src, _, _ in models}


def scale(time_limit_s: float) -> Table:
    nodes = [("H100", 8)] * 60 + [("A100-80GB", 8)] * 40 + [("L40S", 8)] * 25
    models = [(name, src, extra, 30) for name, src, extra in SCALE_MODELS]
    fleet = _fleet(nodes, models)
    profiles = _profiles(models)
    table = Table(title="scale: 1,000 GPUs x 300 instances (plan_fleet end to end)")
    for column in ("policy", "seconds", "GPUs used", "instances", "solver", "target"):
        table.add_column(column, justify="right")
    for policy in ("binpack", "spread"):
        start = time.perf_counter()
        plan = plan_fleet(fleet, policy=policy, time_limit_s=time_limit_s, profiles=profiles)
        seconds = time.perf_counter() - start
        table.add_row(policy, f"{seconds:.2f}", str(plan.totals.gpus_used),
                      str(len(plan.instances)), plan.totals.solver,
                      "ok (<= 5 s)" if seconds <= 5 else "MISSED (> 5 s)")
    return table


SMALL = [  # models whose shares pack several to a card; fixed shares make it bin packing
    ("embed", "Qwen--Qwen3-Embedding-0.6B", "task: embed, max_model_len: 2048, max_num_seqs: 4"),
    ("qwen3-8b", "Qwen--Qwen3-8B", "max_model_len: 2048, max_num_seqs: 4"),
    ("llama-8b", "meta-llama--Llama-3.1-8B", "max_model_len: 2048, max_num_seqs: 4"),
    ("qwen3-32b", "Qwen--Qwen3-32B", "max_model_len: 4096, max_num_seqs: 4"),
]
SHARES = {"embed": [0.1, 0.2, 0.3, 0.45], "qwen3-8b": [0.25, 0.3, 0.35, 0.45, 0.55, 0.7],
          "llama-8b": [0.25, 0.3, 0.4, 0.6], "qwen3-32b": [0.5, 0.6, 0.9]}


def quality(seed: int, fleets: int, time_limit_s: float) -> Table:
    rng = random.Random(seed)
    table = Table(title=f"quality: GPUs used on {fleets} generated fleets (seed {seed})")
    for column in ("fleet", "instances", "greedy", "cp-sat", "lower bound", "optimal",
                   "solve s"):
        table.add_column(column, justify="right")
    sums = [0, 0, 0]
    for n in range(fleets):
        nodes = [("H100", 8)] * rng.randint(2, 4)
        models: list[tuple[str, str, str, int]] = []
        for name, src, extra in SMALL:
            for k, share in enumerate(rng.sample(SHARES[name], k=2)):
                tp = 2 if name == "qwen3-32b" else 1
                models.append((f"{name}-{k}", src,
                               f"{extra}, gpu_memory_utilization: {share}, "
                               f"tensor_parallel_size: {tp}", rng.randint(0, 4)))
        fleet = _fleet(nodes, models)
        slots, items, _, _ = placement_problem(fleet, profiles=_profiles(models))
        greedy = place_greedy(items, slots)
        start = time.perf_counter()
        solved = solve(items, slots, greedy, time_limit_s=time_limit_s)
        seconds = time.perf_counter() - start
        best = solved if solved is not None else greedy
        demand = sum(
            it.demand("H100-SXM-80GB", slots[0].total_bytes)
            * it.shapes["H100-SXM-80GB"].tensor_parallel_size
            for it in items
        )
        bound = math.ceil(demand / slots[0].capacity_units)
        g = greedy.gpus_used() if not greedy.unplaced else -1
        s = best.gpus_used() if not best.unplaced else -1
        if g >= 0 and s >= 0:  # totals over fleets both placers placed
            sums[0] += g
            sums[1] += s
            sums[2] += bound
        table.add_row(str(n), str(len(items)), str(g) if g >= 0 else "unplaced",
                      str(s) if s >= 0 else "unplaced", str(bound),
                      "yes" if solved is not None and solved.optimal else "-",
                      f"{seconds:.2f}")
    table.add_row("total (placed)", "", str(sums[0]), str(sums[1]), str(sums[2]), "", "")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fleets", type=int, default=12)
    parser.add_argument("--time-limit-s", type=float, default=5.0)
    args = parser.parse_args()
    console = Console(width=120)
    console.print(scale(args.time_limit_s))
    console.print(quality(args.seed, args.fleets, args.time_limit_s))


if __name__ == "__main__":
    main()
