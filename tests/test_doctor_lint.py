"""`inferplane lint`: each rule fires on the fleet it is about and stays quiet otherwise."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from inferplane.cli.main import _register_commands, app
from inferplane.doctor.lint import lint_fleet
from inferplane.spec import load_fleet

_register_commands()
MODELS = Path(__file__).parent / "data" / "models"
runner = CliRunner()


def _fleet(tmp_path: Path, gpu: str = "H100", **model: Any) -> Path:
    spec = {
        "gpus": {"nodes": [{"name": "n1", "gpu_type": gpu, "count": 8}]},
        "models": [{"name": "m", "source": str(MODELS / "Qwen--Qwen3-8B"),
                    "max_model_len": 8192, **model}],
    }
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _pids(path: Path) -> list[str]:
    return [a.pitfall for a in lint_fleet(load_fleet(path), path.parent)]


def test_a_sensible_fleet_has_no_advice(tmp_path: Path) -> None:
    assert _pids(_fleet(tmp_path, gpu_memory_utilization=0.85)) == []


def test_enforce_eager_left_on(tmp_path: Path) -> None:
    assert "P33" in _pids(_fleet(tmp_path, enforce_eager=True))


def test_utilization_above_the_band(tmp_path: Path) -> None:
    assert "P06" in _pids(_fleet(tmp_path, gpu_memory_utilization=0.95))
    assert "P06" not in _pids(_fleet(tmp_path, gpu_memory_utilization=0.9))


def test_max_model_len_at_the_models_default_or_auto(tmp_path: Path) -> None:
    assert "P02" in _pids(_fleet(tmp_path, max_model_len=40960))
    advice = lint_fleet(load_fleet(_fleet(tmp_path, max_model_len="auto")))
    auto = [a for a in advice if a.pitfall == "P02"]
    assert auto and auto[0].severity == "info" and "tokens on H100" in auto[0].message


def test_tp_larger_than_needed_is_computed_per_gpu(tmp_path: Path) -> None:
    assert "P16" in _pids(_fleet(tmp_path, tensor_parallel_size=4))
    # a 32B BF16 model does not fit one L40S: TP 2 is needed there
    big = _fleet(tmp_path, gpu="L40S", tensor_parallel_size=2,
                 source=str(MODELS / "Qwen--Qwen3-32B"))
    assert "P16" not in _pids(big)


def test_volatile_prefix_in_the_chat_template(tmp_path: Path) -> None:
    template = tmp_path / "chat.jinja"
    template.write_text("System: today is {{ strftime_now('%Y-%m-%d') }}\n{{ messages }}")
    assert "P45" in _pids(_fleet(tmp_path, extra_args={"chat-template": str(template)}))
    template.write_text("{{ messages }}")
    assert "P45" not in _pids(_fleet(tmp_path, extra_args={"chat-template": str(template)}))


def test_timeouts_shorter_than_the_longest_generation(tmp_path: Path) -> None:
    short = _fleet(tmp_path, timeouts={"total_s": 60})
    assert "P40" in _pids(short)  # 8192 tokens at 20 tokens/s = 410 s
    capped = _fleet(tmp_path, timeouts={"total_s": 60},
                    max_tokens_cap={"limit": 1000, "action": "clamp"})
    assert "P40" not in _pids(capped)


def test_cli_json_strict_and_invalid(tmp_path: Path) -> None:
    path = _fleet(tmp_path, enforce_eager=True)
    result = runner.invoke(app, ["lint", str(path), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["schema"] == "inferplane.lint/v1"
    assert list(doc["advice"][0]) == ["model", "pitfall", "severity", "field", "value",
                                      "message", "fix"]
    assert runner.invoke(app, ["lint", str(path), "--strict"]).exit_code == 1
    text = runner.invoke(app, ["lint", str(path)])
    assert "P33 warn" in text.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: []\n")
    assert runner.invoke(app, ["lint", str(bad)]).exit_code == 2
