"""The saturation sweep through the gateway: S2's table shape, and the knee found."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from inferplane.bench.datasets import BenchRequest, random_dataset
from inferplane.bench.load import find_knee, sweep
from inferplane.bench.target import FleetOnSim
from inferplane.sim.timing import DEFAULT_CALIBRATION

MODEL = Path(__file__).parent / "data" / "models" / "Qwen--Qwen3-8B"
FLEET = f"""\
engine: sim
models:
  - name: chat
    source: {MODEL}
    max_model_len: 2048
    max_num_seqs: 4
"""


def test_knee_is_the_smallest_level_near_peak() -> None:
    # S2's table: 1800, 4200, 5100, 4800 tok/s at 1/8/16/32 -> the sweet spot 16.
    assert find_knee([(1, 1800), (8, 4200), (16, 5100), (32, 4800)]) == 16
    assert find_knee([(1, 100), (2, 195), (4, 390), (8, 395)]) == 4
    assert find_knee([]) is None


def test_sweep_through_the_gateway_finds_max_num_seqs(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    # Every step 25 ms whatever the batch: throughput grows with concurrency until the
    # engine's 4 sequences are all running, then only queueing grows. Requests of 17 steps
    # keep the closed-loop clients' gaps between requests small against the cycle.
    fixed = replace(DEFAULT_CALIBRATION, fixed_prefill_step_s=0.025, fixed_decode_step_s=0.025)
    with FleetOnSim(path, calibration=fixed) as target:
        assert target.models == ["chat"]

        def requests(level: int) -> list[BenchRequest]:
            return random_dataset(2 * level, input_len=32, output_len=16, seed=level).requests

        result = asyncio.run(sweep(target.url, requests, [1, 2, 4, 8], model="chat",
                                   warmup=1))
    table = result.as_dict()
    levels = [row["concurrency"] for row in table["rows"]]
    assert levels == [1, 2, 4, 8], table["stopped"]
    assert "failed" not in table["stopped"]  # saturated, or the levels ran out
    assert result.knee == 4
    rows = {row["concurrency"]: row for row in table["rows"]}
    assert all(row["failed"] == 0 for row in rows.values())
    # S2's columns: concurrency -> p50/p99 latency and tokens/s; past the knee latency grows.
    assert rows[8]["p50_e2el_ms"] > 1.5 * rows[4]["p50_e2el_ms"]
    assert rows[8]["output_throughput_tok_s"] < 1.1 * rows[4]["output_throughput_tok_s"]
    assert rows[4]["output_throughput_tok_s"] > 3 * rows[1]["output_throughput_tok_s"]


def test_best_level_within_the_slo() -> None:
    from inferplane.bench.client import RequestResult
    from inferplane.bench.load import LoadSpec, RunResult, SweepRow, best_within_slo
    from inferplane.bench.metrics import summarize

    def row(level: int, ttft_s: float, tokens: int) -> SweepRow:
        result = RequestResult("m", 10, tokens, True, "", 0.0, ttft_s, ttft_s + 1.0, [], True)
        run = RunResult(LoadSpec("concurrency", concurrency=level),
                        summarize([result], 1.0), [result], 0.0)
        return SweepRow(level, run)

    rows = [row(1, 0.1, 10), row(8, 0.5, 40), row(16, 0.9, 50), row(32, 2.1, 48)]
    # S2: P99 under a second -> 16 (5100 tok/s), not 32 (more latency, less throughput).
    assert best_within_slo(rows, {"ttft_ms": 1000}) == 16
    assert best_within_slo(rows, {"ttft_ms": 50}) is None
    assert best_within_slo(rows, {}) is None


def test_a_sweep_still_growing_at_its_last_level_reports_no_knee(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    fixed = replace(DEFAULT_CALIBRATION, fixed_prefill_step_s=0.025, fixed_decode_step_s=0.025)
    with FleetOnSim(path, calibration=fixed) as target:

        def requests(level: int) -> list[BenchRequest]:
            return random_dataset(2 * level, input_len=32, output_len=16, seed=level).requests

        # the engine runs 4 sequences: at 1 and 2 throughput is still doubling
        result = asyncio.run(sweep(target.url, requests, [1, 2], model="chat", warmup=1))
    assert result.knee is None
    assert "still growing at concurrency 2" in result.stopped
