"""Cost is the price per GPU times the GPUs behind the benchmarked model (issue 28, item
2): not `--gpu-hour-usd` for a whole gateway, not every planned card for one model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from inferplane.bench.cost import PRICES_FILE, load_prices
from inferplane.bench.gpu_cost import target_cost
from inferplane.cli.main import _register_commands, app
from inferplane.errors import InferplaneError
from inferplane.planner.build import plan_fleet
from inferplane.planner.plan import Plan
from inferplane.sim import EngineHost, SimEngineConfig
from inferplane.spec.loader import parse_fleet

MODELS = Path(__file__).parent / "data" / "models"


def _plan(tmp_path: Path) -> Plan:
    text = (
        "engine: sim\n"
        "gpus: {nodes: [{name: a, gpu_type: H100, count: 8}, {name: b, gpu_type: H100, "
        "count: 8}]}\n"
        "models:\n"
        f"  - {{name: big, source: {MODELS / 'meta-llama--Llama-3.1-70B-Instruct'}, "
        "tensor_parallel_size: 8, max_model_len: 4096}\n"
        f"  - {{name: small, source: {MODELS / 'Qwen--Qwen3-8B'}, tensor_parallel_size: 1, "
        "replicas: 2, max_model_len: 4096}\n"
    )
    return plan_fleet(parse_fleet(text, filename=str(tmp_path / "f.yaml")), time_limit_s=0)


def test_only_the_benchmarked_models_gpus_are_charged(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    prices = load_prices()
    small = target_cost(plan, ["small"], None, None, prices)
    assert small is not None
    cards = {(i.node, g) for i in plan.instances if i.model == "small"
             for g in i.gpu_indices}
    assert small.gpus == len(cards) < 16
    h100 = prices["H100-SXM-80GB"].usd_per_gpu_hour
    assert small.usd_per_hour == pytest.approx(len(cards) * h100)
    assert "H100-SXM-80GB" in small.counted and "small" in small.counted
    flat = target_cost(plan, ["big"], 2.5, None, prices)
    assert flat is not None and flat.gpus == 8 and flat.usd_per_hour == pytest.approx(20.0)


def test_a_url_target_is_charged_per_gpu_and_says_how_many() -> None:
    one = target_cost(None, ["m"], 2.5, None, {})
    assert one is not None and one.usd_per_hour == 2.5 and "--gpus" in one.counted
    many = target_cost(None, ["m"], 2.5, 16, {})
    assert many is not None and many.usd_per_hour == 40.0 and many.gpus == 16
    assert target_cost(None, ["m"], None, 16, {}) is None


def test_bench_prints_the_gpus_it_charged() -> None:
    _register_commands()
    with EngineHost([SimEngineConfig(model="m", max_model_len=2048)]) as handles:
        result = CliRunner().invoke(app, [
            "bench", handles[0].url, "--num-requests", "2", "--concurrency", "1",
            "--input-len", "16", "--output-len", "2", "--gpu-hour-usd", "2.5", "--gpus", "16",
            "--json",
        ])
    assert result.exit_code == 0, result.output
    cost = json.loads(result.stdout)["cost"]
    assert cost["usd_per_hour"] == 40.0 and cost["gpus"] == 16
    assert "16 GPU(s) x $2.50/h" in cost["gpus_counted"]


def test_gpus_is_refused_for_a_fleet_file(tmp_path: Path) -> None:
    from inferplane.cli.bench import _target_cost

    with pytest.raises(InferplaneError, match="already says which GPUs"):
        _target_cost(_plan(tmp_path), ["small"], None, 2, None)
    with pytest.raises(InferplaneError, match="must be >= 1"):
        _target_cost(None, ["m"], 2.5, 0, None)


def test_every_shipped_price_names_its_source() -> None:
    rows = yaml.safe_load(PRICES_FILE.read_text())["prices"]
    for name, row in rows.items():
        assert str(row["source"]).startswith("https://"), name
        assert row["as_of"], name
    # the cross-check the file cites for H100 SXM on-demand: $2.49-3.99/h
    assert 2.49 <= load_prices()["H100-SXM-80GB"].usd_per_gpu_hour <= 3.99
