"""Estimates per second over the committed real configs (the planner calls this in loops).

    python benchmarks/estimate_speed.py [--seconds 3]

Baseline in the same run: loading the profile from disk (config.json parse), so the ratio
shows how much cheaper an estimate is than the I/O around it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from inferplane.estimator.memory import AUTO_MAX_MODEL_LEN, estimate_memory
from inferplane.estimator.types import EngineSettings
from inferplane.gpus import lookup_gpu
from inferplane.models import load_profile

MODELS = Path(__file__).resolve().parent.parent / "tests" / "data" / "models"


def _rate(fn: object, seconds: float) -> float:
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()  # type: ignore[operator]
        count += 1
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    dirs = sorted(p for p in MODELS.iterdir() if (p / "config.json").exists())
    profiles = [load_profile(d) for d in dirs]
    gpu = lookup_gpu("H200")
    fixed = EngineSettings(max_model_len=8192, tensor_parallel_size=8)
    auto = EngineSettings(max_model_len=AUTO_MAX_MODEL_LEN, tensor_parallel_size=8)

    def run_fixed() -> None:
        for profile in profiles:
            estimate_memory(profile, fixed, gpu=gpu)

    def run_auto() -> None:
        for profile in profiles:
            estimate_memory(profile, auto, gpu=gpu)

    def run_load() -> None:
        for d in dirs:
            load_profile(d)

    n = len(profiles)
    rows = [
        ("load_profile (baseline)", _rate(run_load, args.seconds) * n),
        ("estimate, fixed max_model_len", _rate(run_fixed, args.seconds) * n),
        ("estimate, max_model_len auto", _rate(run_auto, args.seconds) * n),
    ]
    base = rows[0][1]
    print(f"{len(profiles)} committed configs, H200, TP 8")
    print(f"{'what':34} {'per second':>12} {'vs baseline':>12}")
    for name, rate in rows:
        print(f"{name:34} {rate:12,.0f} {rate / base:11.1f}x")


if __name__ == "__main__":
    main()
