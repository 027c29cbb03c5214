"""The simulator against published vLLM runs it was not fitted on.

benchmarks/data/published_serving.json holds the runs (sources, settings, split);
inferplane/sim/error_bands.json the held-out errors of the shipped constants,
written by `benchmarks/sim_fidelity.py --only published --write-bands`. Replaying every
held-out run takes minutes, so this checks the stored errors against the goal they must
keep, that they are today's (a few cheap held-out runs replayed again agree), and that
no held-out run was fitted on.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from types import ModuleType

import pytest

from inferplane.gpus import lookup_gpu
from inferplane.sim.error_bands import band_for, load_bands
from inferplane.sim.formats import generation

REPO = Path(__file__).resolve().parent.parent
MODELS = REPO / "tests" / "data" / "models"

# What the held-out split reaches today (docs/simulator.md); a change to the timing model
# that makes any of them worse fails here. Issue 31's goal is stricter (10/10/20, max 30).
# 112 held-out runs (10.8 / 11.9 / 19.3 TPOT / throughput / TTFT, 2026-12-02, d28e98e) since the
# chat endpoint's API-server work is modelled as a processor-sharing front end (frontend.py,
# fitted on the fit split's short chat bursts: 21.1 / 7.8 / 7.5 -> 13.7 / 7.8 / 8.5 TTFT /
# TPOT / throughput there); before it 10.8 / 15.1 / 27.8.
HELD_OUT_MEDIAN_PCT = {"tpot": 11.0, "throughput": 12.0, "ttft": 19.5}
# MoE models alone (62 held-out runs: 18.2 / 21.1 / 25.2, were 18.2 / 24.3 / 41.9) must
# not get worse either.
HELD_OUT_MOE_MEDIAN_PCT = {"tpot": 18.5, "throughput": 21.5, "ttft": 25.5}
# Dense models alone (50 held-out runs: 8.1 / 6.2 / 12.9, were 8.1 / 6.2 / 17.2) meet the
# goal's medians; they must keep doing so.
HELD_OUT_DENSE_MEDIAN_PCT = {"tpot": 8.5, "throughput": 6.5, "ttft": 13.0}


@pytest.fixture(scope="module")
def pf() -> ModuleType:
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import published_fidelity
    finally:
        sys.path.pop(0)
    return published_fidelity


def test_the_published_runs_are_sourced_and_split(pf: ModuleType) -> None:
    points = pf.load_points()
    assert len(points) >= 100
    assert len({p["id"] for p in points}) == len(points)
    for p in points:
        assert p["source"].startswith("https://github.com/"), p["id"]
        assert p["split"] in ("fit", "holdout")
        assert (MODELS / p["model"] / "config.json").is_file(), p["model"]
        lookup_gpu(p["gpu"])  # a catalog GPU
        m = p["measured"]
        assert m["mean_ttft_ms"] > 0 and m["median_tpot_ms"] > 0
        assert m["output_throughput_tok_s"] > 0
    fit_models = {p["model"] for p in points if p["split"] == "fit"}
    # Whole models are held out: their runs never reach the fit.
    assert {"Qwen--Qwen3-14B", "openai--gpt-oss-20b"}.isdisjoint(fit_models)
    assert {pf.family(p) for p in points if p["split"] == "holdout"} == {"dense", "moe"}
    assert {pf.weight_format(p) for p in points} >= {"bf16", "fp8", "mxfp4"}


def test_the_io_foundation_runs_follow_their_hash_split(pf: ModuleType) -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import harvest_iog
    finally:
        sys.path.pop(0)
    iog = [p for p in pf.load_points() if p["id"].startswith("iog-")]
    assert {p["gpu"] for p in iog} == {"H100-PCIE-80GB", "RTX-4090"}
    for p in iog:  # split before any fit, by the stated rule, never by hand
        assert p["split"] == harvest_iog.split_of(p["id"]), p["id"]
        assert p["workload"]["arrivals"] == "poisson" and p["workload"]["request_rate"] > 0
    assert {p["split"] for p in iog if p["gpu"] == "RTX-4090"} == {"fit", "holdout"}


def test_the_second_gpustack_harvest_follows_its_hash_split(pf: ModuleType) -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import harvest_gpustack
    finally:
        sys.path.pop(0)
    added = [p for p in pf.load_points() if p["model"] in harvest_gpustack.HASH_SPLIT_MODELS]
    for p in added:  # split before any fit on them, by the stated rule, never by hand
        assert p["split"] == harvest_gpustack.split_of(p["id"]), p["id"]
    fit = [p for p in added if p["split"] == "fit"]
    # The fit sees MLA (DeepSeek-V3.2) and H200, and MoE on A100 in fp8 and bf16.
    assert any(pf._profile(p["model"]).uses_mla and p["gpu"] == "H200" for p in fit)
    assert {pf.weight_format(p) for p in fit if p["gpu"] == "A100-SXM-80GB"} >= {"bf16", "fp8"}
    assert {p["split"] for p in added} == {"fit", "holdout"}
    # Runs that repeat another GPU's page digit for digit are left out.
    runs = [(p["model"], p["tp"], str(p["workload"]), str(p["measured"])) for p in added]
    assert len(set(runs)) == len(runs)


def test_stored_held_out_errors_are_the_held_out_points(pf: ModuleType) -> None:
    bands = load_bands()
    held = {p["id"] for p in pf.load_points() if p["split"] == "holdout"}
    stored = bands["points"]
    replayed = {s["id"] for s in stored}
    not_replayed = {line.split(":")[0] for line in bands["not_replayed"]}
    assert replayed | not_replayed == held and not replayed & not_replayed
    for metric in pf.METRICS:
        errs = [abs(s[f"{metric}_error_pct"]) for s in stored if f"{metric}_error_pct" in s]
        assert bands["overall"][metric]["median"] == pytest.approx(statistics.median(errs),
                                                                   abs=0.051)
        assert statistics.median(errs) <= HELD_OUT_MEDIAN_PCT[metric], metric
    groups = {(g["gpu"], g["family"]): g for g in bands["groups"]}
    by_id = {p["id"]: p for p in pf.load_points()}
    for (gpu, fam), group in groups.items():
        mine = [s for s in stored if by_id[s["id"]]["gpu"] == gpu
                and pf.family(by_id[s["id"]]) == fam]
        assert group["n"] == len(mine)
        for metric in pf.METRICS:
            errs = [abs(s[f"{metric}_error_pct"]) for s in mine if f"{metric}_error_pct" in s]
            assert group[metric]["n"] == len(errs)
            if errs:
                assert group[metric]["median"] == pytest.approx(statistics.median(errs),
                                                                abs=0.051)


def test_dense_held_out_medians_stay_within_the_goal(pf: ModuleType) -> None:
    by_id = {p["id"]: p for p in pf.load_points()}
    dense = [s for s in load_bands()["points"] if pf.family(by_id[s["id"]]) == "dense"]
    assert len(dense) >= 50
    assert {by_id[s["id"]]["gpu"] for s in dense} >= {"H100-PCIE-80GB", "RTX-4090",
                                                       "H100-SXM-80GB", "A100-SXM-80GB"}
    for metric, limit in HELD_OUT_DENSE_MEDIAN_PCT.items():
        errs = [abs(s[f"{metric}_error_pct"]) for s in dense if f"{metric}_error_pct" in s]
        assert statistics.median(errs) <= limit, metric


def test_moe_held_out_medians_do_not_get_worse(pf: ModuleType) -> None:
    by_id = {p["id"]: p for p in pf.load_points()}
    moe = [s for s in load_bands()["points"] if pf.family(by_id[s["id"]]) == "moe"]
    assert len(moe) >= 60
    assert {by_id[s["id"]]["gpu"] for s in moe} >= {"H100-SXM-80GB", "A100-SXM-80GB", "H200"}
    for metric, limit in HELD_OUT_MOE_MEDIAN_PCT.items():
        errs = [abs(s[f"{metric}_error_pct"]) for s in moe if f"{metric}_error_pct" in s]
        assert statistics.median(errs) <= limit, metric


def test_stored_errors_are_what_the_shipped_model_gives_today(pf: ModuleType) -> None:
    stored = {s["id"]: s for s in load_bands()["points"]}
    points = {p["id"]: p for p in pf.load_points()}
    # The cheapest held-out runs of each family (few requests or short outputs).
    cheap = sorted(stored, key=lambda i: points[i]["workload"]["num_prompts"]
                   * points[i]["workload"]["mean_output_len"])
    chosen = [i for fam in ("dense", "moe")
              for i in [j for j in cheap if pf.family(points[j]) == fam][:2]]
    for point_id in chosen:
        row = pf.replay(points[point_id])
        for metric in row.metrics:
            assert row.error(metric) == pytest.approx(
                stored[point_id][f"{metric}_error_pct"], abs=0.05), (point_id, metric)


def test_bands_name_what_no_data_backs() -> None:
    h100 = band_for(lookup_gpu("H100-SXM-80GB"), "dense", "bf16")
    assert h100.statement.startswith("±") and "held-out published vLLM runs" in h100.statement
    assert not h100.missing
    b200 = band_for(lookup_gpu("B200"), "dense", "fp4")
    assert any("B200" in m for m in b200.missing)
    assert any("fp4 weights on blackwell" in m for m in b200.missing)
    assert any("not validated" in line for line in b200.lines())
    # GPUs with held-out runs of their own (a datacenter PCIe card, a consumer card).
    for name in ("H100-PCIE-80GB", "RTX-4090"):
        own = band_for(lookup_gpu(name), "dense", "bf16")
        assert f"{name} dense" in own.statement and not own.missing, name
        assert any(f"moe models on {name}" in m
                   for m in band_for(lookup_gpu(name), "moe", "bf16").missing)
    # A GPU with no runs of its own quotes its generation's band and says so.
    for name, gen in (("H100-NVL-94GB", "hopper"), ("L40S", "ada")):
        other = band_for(lookup_gpu(name), "dense", "bf16")
        assert generation(lookup_gpu(name)) == gen
        assert gen in other.statement and f"not on {name} itself" in other.statement
        assert any(name in m for m in other.missing)


def test_each_publisher_replays_the_endpoint_it_benchmarked(pf: ModuleType) -> None:
    points = {p["id"]: p for p in pf.load_points()}
    # GPUStack's pages run `vllm bench serve --backend openai-chat`, IO Foundation's
    # result files the `vllm` backend (/v1/completions): only the chat runs pay the chat
    # front end, gpt-oss and DeepSeek-V3.2 (with its tokenizer mode) at the coded rate.
    assert pf.endpoint(points["gpustack-qwen3-235b-a22b-h100-6"]) == "chat"
    assert {pf.endpoint(p) for i, p in points.items() if i.startswith("iog-")} == {
        "completions"}
    assert not pf.coded_chat(points["gpustack-qwen3-235b-a22b-h100-6"])
    assert pf.coded_chat(points["gpustack-gpt-oss-120b-h100-8"])
    assert pf.coded_chat(points["gpustack-deepseek-v3.2-h200-5"])
    assert not pf.coded_chat(points["gpustack-deepseek-r1-h200-4"])


def test_runs_are_grouped_by_load_shape(pf: ModuleType) -> None:
    points = {p["id"]: p for p in pf.load_points()}
    assert pf.regime(points["gpustack-qwen3-235b-a22b-h100-6"]) == "burst, short prompts"
    assert pf.regime(points["gpustack-qwen3-235b-a22b-h100-0"]) == "burst, ShareGPT"
    assert pf.regime(points["gpustack-qwen3-235b-a22b-h100-4"]) == "long prompts"
    assert pf.regime(points["gpustack-gpt-oss-120b-a100-9"]) == "capped or paced"
    row = pf.Row(points["gpustack-qwen3-235b-a22b-h100-6"],
                 {"ttft": 100.0, "tpot": 10.0, "throughput": 50.0},
                 {"ttft": 50.0, "tpot": 10.0, "throughput": 75.0})
    # A 4-token run is not compared on TPOT; the signs say which way the model errs.
    assert pf.regime_summary([row]) == [
        ("moe", "burst, short prompts", 1, {"ttft": -50.0, "tpot": None, "throughput": 50.0})]
