"""`inferplane capacity`: the simulated-clock search, its binding constraint, and a fleet
fragment the planner takes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from inferplane.bench import simclock
from inferplane.bench.capacity import _binding, fleet_fragment, plan_capacity
from inferplane.bench.cost import load_prices
from inferplane.bench.simclock import Arrival, Outcome, simulate
from inferplane.bench.traffic import parse_traffic
from inferplane.cli.main import _register_commands, app
from inferplane.errors import InferplaneError
from inferplane.planner.build import plan_fleet
from inferplane.sim.build import build_parts
from inferplane.sim.config import SimEngineConfig
from inferplane.sim.core import EngineCore, KvCapacity
from inferplane.spec import load_fleet
from inferplane.spec.loader import parse_fleet

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "inferplane" / "bench" / "examples"
S4_FLEET = REPO / "examples" / "s4-deepseek-qwen-mix.yaml"
QWEN3_8B = REPO / "tests" / "data" / "models" / "Qwen--Qwen3-8B" / "config.json"


def _core(max_num_seqs: int = 64) -> EngineCore:
    parts = build_parts(SimEngineConfig(model="m", model_config=QWEN3_8B, max_model_len=8192,
                                        max_num_seqs=max_num_seqs))
    m = parts.memory
    return EngineCore(KvCapacity(m.num_gpu_blocks, m.block_size, m.max_num_seqs,
                                 m.max_num_batched_tokens), parts.timing)


def test_jumps_over_decode_steps_change_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    traffic = parse_traffic({"models": {"m": {
        "peak_rps": 8, "input_tokens": {"mean": 800, "range": 0.5},
        "output_tokens": {"mean": 120, "range": 0.5}, "prefix_share": 0.5,
        "num_prefixes": 2}}}, "t").models["m"]
    arrivals: list[Arrival] = traffic.arrivals(8.0, 80, seed=3)
    fast = simulate(_core(), arrivals)
    assert fast.jumped_steps > fast.steps // 2  # most decode steps were jumped
    monkeypatch.setattr(simclock._Run, "jump", lambda self: False)
    slow = simulate(_core(), arrivals)
    assert (fast.completed, fast.steps, fast.output_tokens) == (80, slow.steps, slow.output_tokens)
    assert fast.ttft_s == pytest.approx(slow.ttft_s, rel=1e-9)
    assert sorted(fast.tpot_s) == pytest.approx(sorted(slow.tpot_s), rel=1e-9)
    assert fast.duration_s == pytest.approx(slow.duration_s, rel=1e-12)


def test_a_lost_slo_stops_the_run_early() -> None:
    traffic = parse_traffic({"models": {"m": {"peak_rps": 1, "input_tokens": 4000,
                                              "output_tokens": 50}}}, "t").models["m"]
    arrivals = traffic.arrivals(200.0, 200)  # far past what one H100 prefills
    out = simulate(_core(), arrivals, measure_from=20,
                   limits=simclock.Limits(ttft_s=0.5, allowed_violations=1))
    assert out.stopped_early and out.completed < 200


def test_binding_constraint_names_kv_or_compute() -> None:
    from inferplane.bench.capacity import Candidate, Evaluation

    cand = Candidate("m", "H100-SXM-80GB", 1, 64, 8192, 0.9, 1000, 4.76,
                     None)  # type: ignore[arg-type]  # no engine needed here
    kv = Outcome(steps=100, preemptions=3, peak_kv_usage=1.0, kv_blocked_steps=40)
    busy = Outcome(steps=100, seq_capped_steps=50, peak_kv_usage=0.4, ttft_s=[1.0])
    best = Evaluation(cand, 3, True, 100, 20, 900, Outcome())
    assert _binding(best, Evaluation(cand, 2, False, 0, 0, 0, kv), None, {})[0] == "KV capacity"
    binding, detail = _binding(best, Evaluation(cand, 2, False, 5000, 20, 0, busy), None, {})
    assert binding == "compute" and "max_num_seqs=64" in detail
    one = Evaluation(cand, 1, True, 100, 20, 900, Outcome())
    assert _binding(one, None, None, {})[0] == "memory"


def test_s4_answer_is_planned_by_the_planner() -> None:
    fleet = load_fleet(S4_FLEET)
    traffic = parse_traffic({"models": {"qwen3-8b": {
        "peak_rps": 40, "input_tokens": {"mean": 800, "range": 0.5},
        "output_tokens": {"mean": 200, "range": 0.5}}}}, "t")
    answer = plan_capacity(fleet, traffic, gpus=["H100", "L40S"], prices=load_prices(),
                           slo={"ttft_ms": 2000, "tpot_ms": 40}, requests=60)
    (model,) = answer.models
    assert model.best is not None and model.best.meets
    assert model.binding in ("memory", "KV capacity", "compute") and model.detail
    assert answer.evaluated == model.evaluated >= 5
    assert model.best.p_tpot_ms <= 40 and model.best.p_ttft_ms <= 2000
    # The answer states the simulator's measured error for its GPU type and model family
    # (or, for a GPU without held-out published runs, warns what is missing).
    gpu = model.best.candidate.gpu_type
    band = [n for n in answer.notes if n.startswith(f"qwen3-8b on {gpu}: ")]
    assert band and ("held-out published vLLM runs" in band[0] or "not validated" in band[-1])
    raw = yaml.safe_load(S4_FLEET.read_text())
    fragment = fleet_fragment(fleet, raw, answer)
    (entry,) = fragment["models"]
    assert entry["replicas"] == model.best.replicas
    assert entry["placement"]["gpu_type"] == model.best.candidate.gpu_type
    planned = plan_fleet(parse_fleet(yaml.safe_dump(fragment), filename="fragment.yaml"),
                         time_limit_s=0.5, check_fixes=False)
    assert len(planned.instances_of("qwen3-8b")) == model.best.replicas
    assert {i.tensor_parallel_size for i in planned.instances} == {
        model.best.candidate.tensor_parallel_size}


def test_capacity_cli_on_s2_writes_a_fragment_plan_accepts(tmp_path: Path) -> None:
    _register_commands()
    runner = CliRunner()
    fragment = tmp_path / "fragment.yaml"
    result = runner.invoke(app, [
        "capacity", str(EXAMPLES / "s2-rag-7b.yaml"), "--traffic",
        str(EXAMPLES / "s2-traffic.yaml"), "--gpus", "A100-80GB", "--requests", "60",
        "--api-price", "0.14", "--out", str(fragment), "--json",
    ])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    (row,) = data["models"]
    assert row["gpu_type"] == "A100-SXM-80GB" and row["binding"]
    assert row["cost"]["usd_per_m_output_tokens"] > 0
    assert row["cost"]["breakeven_output_tokens_per_day"] > 0
    assert data["plan_check"].startswith("inferplane plan accepts it")
    assert any(n.startswith(f"{row['model']} on A100-SXM-80GB: simulated timing: ±")
               and "held-out published vLLM runs" in n for n in data["notes"]), data["notes"]
    planned = runner.invoke(app, ["plan", str(fragment), "--time-limit-s", "0"])
    assert planned.exit_code == 0, planned.output


def test_capacity_refuses_a_model_the_fleet_does_not_run() -> None:
    fleet = load_fleet(S4_FLEET)
    traffic = parse_traffic({"models": {"nope": {"peak_rps": 1, "input_tokens": 10,
                                                 "output_tokens": 10}}}, "t")
    with pytest.raises(InferplaneError, match="not a model of the fleet"):
        plan_capacity(fleet, traffic, gpus=["H100"], prices=load_prices(),
                      slo={"ttft_ms": 1000})
    with pytest.raises(InferplaneError, match="latency target"):
        plan_capacity(fleet, traffic, gpus=["H100"], prices=load_prices(), slo={})


def test_a_run_ends_when_its_measured_requests_have_finished() -> None:
    traffic = parse_traffic({"models": {"m": {"peak_rps": 1, "input_tokens": 200,
                                              "output_tokens": 100}}}, "t").models["m"]
    arrivals = traffic.arrivals(20.0, 120, seed=1)
    out = simulate(_core(), arrivals, measure_from=20, measure_until=60)
    assert len(out.ttft_s) == 40 and not out.stopped_early
    assert out.completed < 120  # the load-only tail was not run to the end


def test_jumps_keep_the_sliding_window_of_gpt_oss(monkeypatch: pytest.MonkeyPatch) -> None:
    config = REPO / "tests" / "data" / "models" / "openai--gpt-oss-20b"

    def core() -> EngineCore:
        parts = build_parts(SimEngineConfig(model="m", model_config=config, max_model_len=8192,
                                            max_num_seqs=32))
        m = parts.memory
        return EngineCore(KvCapacity(m.num_gpu_blocks, m.block_size, m.max_num_seqs,
                                     m.max_num_batched_tokens), parts.timing)

    traffic = parse_traffic({"models": {"m": {
        "peak_rps": 4, "input_tokens": {"mean": 600, "range": 0.5},
        "output_tokens": {"mean": 150, "range": 0.5}}}}, "t").models["m"]
    arrivals: list[Arrival] = traffic.arrivals(4.0, 40, seed=5)
    fast = simulate(core(), arrivals)
    assert fast.jumped_steps > 0
    monkeypatch.setattr(simclock._Run, "jump", lambda self: False)
    slow = simulate(core(), arrivals)
    assert sorted(fast.tpot_s) == pytest.approx(sorted(slow.tpot_s), rel=1e-9)
    assert fast.duration_s == pytest.approx(slow.duration_s, rel=1e-12)
