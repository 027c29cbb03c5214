"""Planner speed, end to end with `plan_fleet` (sizing, greedy, CP-SAT, argv/env, Plan):

1. a realistic 64-GPU fleet (8 nodes of H100 / A100-80GB / L40S) with 40 models, 1-2
   replicas each, co-located embeddings: target a few seconds (5 s);
2. 1,000 GPUs (125 nodes of 8) and 300 instances: target 1 s.

Quality against the exhaustive reference: benchmarks/plan_quality.py.

    .venv/bin/python benchmarks/plan_scale.py [--time-limit-s 5]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from inferplane.models import load_profile
from inferplane.models.profile import ModelProfile
from inferplane.planner.build import plan_fleet
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


MID_MODELS = [  # (directory, extra fields): 40 models, 1-2 replicas, on 64 GPUs
    ("Qwen--Qwen3-8B", "max_model_len: 8192, max_num_seqs: 32"),
    ("meta-llama--Llama-3.1-8B-Instruct", "max_model_len: 16384, max_num_seqs: 16"),
    ("mistralai--Mistral-7B-Instruct-v0.3", "max_model_len: 8192"),
    ("Qwen--Qwen2.5-7B-Instruct", "max_model_len: 16384, max_num_seqs: 16"),
    ("google--gemma-2-9b-it", "max_model_len: 4096, max_num_seqs: 16"),
    ("Qwen--Qwen3-32B", "max_model_len: 16384, max_num_seqs: 16"),
    ("Qwen--Qwen3-32B-FP8", "max_model_len: 8192, max_num_seqs: 16"),
    ("Qwen--Qwen3-Embedding-0.6B", "task: embed, max_model_len: 2048, max_num_seqs: 8"),
    ("openai--gpt-oss-20b", "max_model_len: 8192, max_num_seqs: 16"),
    ("Qwen--Qwen3-30B-A3B", "max_model_len: 8192, max_num_seqs: 8"),
]


def mid_fleet() -> tuple[FleetSpec, dict[str, ModelProfile]]:
    """64 GPUs on 8 nodes of three types; 40 models (each directory 4 times with other
    lengths, concurrency and replicas; a few embeddings co-located with chat models)."""
    nodes = [("H100", 8)] * 4 + [("A100-80GB", 8)] * 2 + [("L40S", 8)] * 2
    models: list[tuple[str, str, str, int]] = []
    for copy in range(4):
        for n, (src, extra) in enumerate(MID_MODELS):
            name = f"m{copy}-{n}"
            if copy == 1:
                extra = extra.replace("max_model_len: 8192", "max_model_len: 4096")
            if copy == 3 and "embed" in extra:
                extra += f", placement: {{colocate_with: [m{copy}-0]}}"
            models.append((name, src, extra, 1 + (n + copy) % 2))
    return _fleet(nodes, models), _profiles(models)


def timings(time_limit_s: float) -> Table:
    table = Table(title="plan_fleet end to end (sizing, greedy, CP-SAT, argv/env, the Plan)")
    for column in ("fleet", "objective", "policy", "seconds", "GPUs used", "instances",
                   "solver", "target"):
        table.add_column(column, justify="right")
    mid, mid_profiles = mid_fleet()
    big_nodes = [("H100", 8)] * 60 + [("A100-80GB", 8)] * 40 + [("L40S", 8)] * 25
    big_models = [(name, src, extra, 30) for name, src, extra in SCALE_MODELS]
    cases = [
        ("64 GPUs x 40 models", mid, mid_profiles, 5.0),
        ("1,000 GPUs x 300 instances", _fleet(big_nodes, big_models),
         _profiles(big_models), 1.0),
    ]
    runs = [(o, p) for o in ("min_gpus", "utilize") for p in ("binpack", "spread")]
    for label, fleet, profiles, target in cases:
        for objective, policy in runs:
            start = time.perf_counter()
            plan = plan_fleet(fleet, policy=policy, time_limit_s=time_limit_s,  # type: ignore[arg-type]
                              profiles=profiles, objective=objective)  # type: ignore[arg-type]
            seconds = time.perf_counter() - start
            table.add_row(label, objective, policy, f"{seconds:.2f}",
                          str(plan.totals.gpus_used),
                          str(len(plan.instances)), plan.totals.solver,
                          f"ok (<= {target:g} s)" if seconds <= target
                          else f"MISSED (> {target:g} s)")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit-s", type=float, default=5.0)
    args = parser.parse_args()
    console = Console(width=140)
    plan_fleet(mid_fleet()[0], profiles=mid_fleet()[1], time_limit_s=0.1)  # warm imports
    console.print(timings(args.time_limit_s))


if __name__ == "__main__":
    main()
