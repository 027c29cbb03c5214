"""Simulator fidelity: published vLLM measurements vs the simulator, with % error.

    .venv/bin/python benchmarks/sim_fidelity.py [--fit]

Reads tests/data/vllm_perf/measurements.json, replays each workload on the simulated clock
(same lengths, same arrival pattern) and prints measured vs simulated. `--fit` grid-searches
the calibration constants on the `calibrate` split first and reports held-out error with
them; without it the shipped DEFAULT_CALIBRATION is used.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from inferplane.engines.sim.build import build_parts
from inferplane.engines.sim.config import SimEngineConfig
from inferplane.engines.sim.core import EngineCore, KvCapacity
from inferplane.engines.sim.offline import WorkItem, run_workload, synthetic_prompt
from inferplane.engines.sim.timing import DEFAULT_CALIBRATION, Calibration

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "vllm_perf" / "measurements.json"
MODELS = ROOT / "tests" / "data" / "models"


def _items(entry: dict[str, Any]) -> list[WorkItem]:
    if "input_lens" in entry:
        pairs = list(zip(entry["input_lens"], entry["output_lens"], strict=True))
    else:
        pairs = [(entry["input_len"], entry["output_len"])] * entry["num_prompts"]
    return [WorkItem(synthetic_prompt(max(1, i), n), max(1, o)) for n, (i, o) in enumerate(pairs)]


def simulate(entry: dict[str, Any], calibration: Calibration) -> tuple[str, float, float]:
    """(metric name, measured, simulated) for one entry."""
    config = SimEngineConfig(
        model=entry["id"], model_config=MODELS / entry["model"], gpu=entry["gpu"],
        tensor_parallel_size=entry["tp"], max_model_len=entry["max_model_len"],
        gpu_memory_utilization=entry.get("gpu_memory_utilization", 0.9),
        max_num_seqs=entry.get("max_num_seqs"), calibration=calibration,
    )
    parts = build_parts(config)
    m = parts.memory
    core = EngineCore(
        KvCapacity(m.num_gpu_blocks, m.block_size, m.max_num_seqs, m.max_num_batched_tokens),
        parts.timing,
    )
    result = run_workload(
        core, _items(entry), max_concurrency=entry.get("max_concurrency"),
        request_rate=entry.get("request_rate"),
    )
    measured = entry["measured"]
    if "output_throughput_tok_s" in measured:
        return "output tok/s", measured["output_throughput_tok_s"], result.output_throughput_tok_s
    return "decode tok/s/req", measured["decode_tok_s_per_request"], 1.0 / result.mean_tpot_s


def errors(entries: list[dict[str, Any]], calibration: Calibration) -> list[float]:
    out = []
    for entry in entries:
        _, measured, simulated = simulate(entry, calibration)
        out.append(abs(simulated - measured) / measured)
    return out


def fit(entries: list[dict[str, Any]]) -> Calibration:
    best: tuple[float, Calibration] | None = None
    for bw, comp, step_ms in itertools.product(
        (0.6, 0.7, 0.8, 0.9), (0.35, 0.45, 0.55, 0.65), (1.0, 2.5, 4.0, 6.0)
    ):
        cal = replace(DEFAULT_CALIBRATION, bandwidth_efficiency=bw, compute_efficiency=comp,
                      step_overhead_s=step_ms / 1000)
        score = statistics.median(errors(entries, cal))
        if best is None or score < best[0]:
            best = (score, cal)
    assert best is not None
    return best[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fit", action="store_true", help="refit calibration first")
    args = parser.parse_args()
    entries = json.loads(DATA.read_text())["entries"]
    calibration = DEFAULT_CALIBRATION
    if args.fit:
        calibration = fit([e for e in entries if e["split"] == "calibrate"])
    print(f"calibration: {calibration}")
    print(f"{'entry':52} {'split':9} {'metric':17} {'measured':>9} {'simulated':>9} {'err%':>7}")
    held: list[float] = []
    for entry in entries:
        metric, measured, simulated = simulate(entry, calibration)
        err = (simulated - measured) / measured * 100
        if entry["split"] == "holdout":
            held.append(abs(err))
        print(f"{entry['id']:52} {entry['split']:9} {metric:17} {measured:9.1f} "
              f"{simulated:9.1f} {err:+7.1f}")
    print(f"held-out median |error|: {statistics.median(held):.1f}% over {len(held)} entries")


if __name__ == "__main__":
    main()
