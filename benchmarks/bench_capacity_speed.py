"""How fast `inferplane capacity` evaluates configurations on the simulated clock.

    python benchmarks/bench_capacity_speed.py            # S2 and S4 scenarios + baseline

Runs the capacity search for seed S2's and S4's scenarios (inferplane/bench/examples)
and prints configurations evaluated, seconds and configurations per second. The baseline,
measured in the same run, is the same S2 search with the decode-step jumps of
`inferplane.bench.simclock` switched off (every scheduler step run one by one, as
`sim/offline.py` does); the ratio is the jumps' speed-up. Answers must be equal.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from inferplane.bench import simclock
from inferplane.bench.capacity import CapacityAnswer, plan_capacity
from inferplane.bench.cost import load_prices
from inferplane.bench.traffic import load_traffic
from inferplane.spec import load_fleet

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "inferplane" / "bench" / "examples"
SCENARIOS = {
    "S2": (EXAMPLES / "s2-rag-7b.yaml", EXAMPLES / "s2-traffic.yaml",
           ["H100", "L40S", "A100-80GB"]),
    "S4": (REPO / "examples" / "s4-deepseek-qwen-mix.yaml", EXAMPLES / "s4-traffic.yaml",
           ["H100", "H200", "A100-80GB", "L40S"]),
}


def run(name: str) -> tuple[CapacityAnswer, float]:
    fleet_path, traffic_path, gpus = SCENARIOS[name]
    fleet, traffic = load_fleet(fleet_path), load_traffic(traffic_path)
    started = time.perf_counter()
    answer = plan_capacity(fleet, traffic, gpus=gpus, prices=load_prices(), slo=traffic.slo)
    return answer, time.perf_counter() - started


def brief(answer: CapacityAnswer) -> str:
    parts = []
    for m in answer.models:
        if m.best is None:
            parts.append(f"{m.model}: none")
            continue
        c = m.best.candidate
        parts.append(f"{m.model}: {m.best.replicas}x TP{c.tensor_parallel_size} "
                     f"{c.gpu_type} seqs {c.max_num_seqs} ({m.binding})")
    return "; ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-baseline", action="store_true")
    args = parser.parse_args()
    print(f"{'scenario':<14} {'configs':>7} {'seconds':>8} {'configs/s':>10}  answer")
    results = {}
    for name in SCENARIOS:
        answer, seconds = run(name)
        results[name] = (answer, seconds)
        print(f"{name:<14} {answer.evaluated:>7} {seconds:>8.2f} "
              f"{answer.evaluated / seconds:>10.1f}  {brief(answer)}")
    if args.no_baseline:
        return
    original = simclock._Run.jump
    simclock._Run.jump = lambda self: False  # type: ignore[method-assign]
    try:
        base, base_s = run("S2")
    finally:
        simclock._Run.jump = original  # type: ignore[method-assign]
    print(f"{'S2 no jumps':<14} {base.evaluated:>7} {base_s:>8.2f} "
          f"{base.evaluated / base_s:>10.1f}  {brief(base)}")
    fast, fast_s = results["S2"]
    same = brief(base) == brief(fast)
    print(f"speed-up of the decode jumps on S2: {base_s / fast_s:.1f}x "
          f"(answers {'equal' if same else 'DIFFER'})")


if __name__ == "__main__":
    main()
