"""`lint` reads manifests the way people write them (issue 26): a vllm/vllm-openai container
with only `args:` runs the API server; --gpu-memory-utilization above the safe band (P06) is
flagged; refusals have the `error PATH: what. Fix: how` form of the other lint errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import inferplane.cli.lint  # noqa: F401  (registers `lint` on the app)
from inferplane.cli.main import app
from inferplane.doctor.probes import find_engines, lint_manifests

DATA = Path(__file__).parent / "data"
MANIFESTS = DATA / "doctor" / "manifests-handwritten"
MODELS = DATA / "models"
runner = CliRunner()


def test_args_only_vllm_openai_container_is_the_api_server() -> None:
    [engine] = find_engines([MANIFESTS / "vllm-openai-args-only.yaml"])
    assert engine.container == "vllm"  # the busybox sidecar with args is not an engine
    assert engine.model == "mistralai/Mistral-7B-Instruct-v0.3"
    assert engine.args[:2] == ("--model", "mistralai/Mistral-7B-Instruct-v0.3")


def test_args_only_deployment_reports_probe_and_utilization_problems() -> None:
    advice = lint_manifests(MANIFESTS / "vllm-openai-args-only.yaml", models_root=MODELS)
    by_field = {(a.pitfall, a.field.rsplit(": ", 1)[-1]): a for a in advice}
    assert by_field[("P24", "livenessProbe")].severity == "warn"
    assert ("P24", "readinessProbe") in by_field
    util = by_field[("P06", "--gpu-memory-utilization")]
    assert util.severity == "warn" and util.value == 0.95
    assert util.fix == "--gpu-memory-utilization 0.90"
    assert "Mistral-7B" in util.message  # the band is the model's, its config.json is local


@pytest.mark.parametrize(("value", "flagged"), [("0.9", False), ("0.92", True), ("$(U)", False)])
def test_utilization_band_edges(tmp_path: Path, value: str, flagged: bool) -> None:
    text = (MANIFESTS / "vllm-openai-args-only.yaml").read_text().replace('"0.95"', f'"{value}"')
    (tmp_path / "d.yaml").write_text(text)
    p06 = [a for a in lint_manifests(tmp_path / "d.yaml", models_root=MODELS) if a.pitfall == "P06"]
    assert bool(p06) == flagged


def test_a_command_that_is_not_vllm_is_not_an_engine(tmp_path: Path) -> None:
    text = (MANIFESTS / "vllm-openai-args-only.yaml").read_text().replace(
        "        args:\n        - --model", "        command: [python, bench.py]\n        args:\n"
        "        - --model", 1)
    (tmp_path / "d.yaml").write_text(text)
    assert find_engines([tmp_path / "d.yaml"]) == []


def test_manifest_refusal_has_the_form_of_the_other_errors(tmp_path: Path) -> None:
    cm = tmp_path / "cm.yaml"
    cm.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    result = runner.invoke(app, ["lint", str(cm)])
    assert result.exit_code == 2
    assert result.output.startswith(f"error {cm}: no container runs `vllm serve`")
    assert "error manifests:" not in result.output and ". Fix: point lint at" in result.output
    missing = runner.invoke(app, ["lint", str(tmp_path / "nope.yaml")])
    assert missing.output.startswith(f"error {tmp_path / 'nope.yaml'}: no such file")
