"""The simulator against published vLLM numbers (benchmarks/sim_fidelity.py), kept in CI:
TTFT and TPOT as concurrency grows (H100 and A100, Llama-3 8B TP1 and 70B TP4) and output
throughput of single runs, each at a held-out median |error| of at most 10% with the
shipped calibration. Everything runs on the simulated clock (a few seconds of CPU)."""

from __future__ import annotations

import contextlib
import io
import json
import statistics
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def fidelity() -> ModuleType:
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import sim_fidelity
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    return sim_fidelity


def test_the_sweeps_are_sourced_and_complete(fidelity: ModuleType) -> None:
    doc = json.loads(fidelity.SWEEPS.read_text())
    assert {s["gpu"] for s in doc["series"]} >= {"H100-SXM-80GB", "A100-SXM-80GB"}
    assert len({s["model"] for s in doc["series"]}) >= 2  # two model sizes
    for series in doc["series"]:
        assert len(series["output_lens"]) == len(doc["input_lens"])
        splits = {p["split"] for p in series["points"]}
        assert splits == {"train", "holdout"}, series["id"]
        for point in series["points"]:
            assert point["source"].startswith("https://github.com/LambdaLabsML/vllm-benchmark/")
            assert point["num_prompts"] <= len(doc["input_lens"])
            assert point["measured"]["mean_ttft_ms"] > 0 and point["measured"]["median_tpot_ms"] > 0
        # The 640-request files are the lengths' source: their totals match exactly.
        last = max(series["points"], key=lambda p: p["num_prompts"])
        assert sum(series["output_lens"]) == last["measured"]["total_output_tokens"]


def test_ttft_and_tpot_across_concurrency_held_out_within_10_percent(
    fidelity: ModuleType,
) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        held = fidelity.concurrency_report("shipped")
    assert len(held) == 14
    assert statistics.median(held) <= 10.0


def test_the_generic_constants_are_what_per_gpu_calibration_improves_on(
    fidelity: ModuleType,
) -> None:
    # Guards the comparison itself: without per-GPU constants the error is much larger,
    # so the shipped numbers above come from GPU_CALIBRATION, not from the data being easy.
    # (14.2% generic against 4.9% shipped since the LM head runs once per sequence; the
    # bound was 15% when the head was counted per prompt token.)
    with contextlib.redirect_stdout(io.StringIO()):
        generic = fidelity.concurrency_report("generic")
        shipped = fidelity.concurrency_report("shipped")
    assert statistics.median(generic) > 12.0
    assert statistics.median(generic) > 2 * statistics.median(shipped)


def test_throughput_entries_held_out_within_10_percent(fidelity: ModuleType) -> None:
    entries = json.loads(fidelity.DATA.read_text())["entries"]
    held = []
    for entry in entries:
        if entry["split"] == "holdout":
            _, measured, simulated = fidelity.simulate(entry, fidelity.DEFAULT_CALIBRATION)
            held.append(abs(simulated / measured - 1) * 100)
    assert statistics.median(held) <= 10.0
