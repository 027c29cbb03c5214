"""`inferplane lint` on hand-written Kubernetes manifests: probes shorter than the model's
load-time estimate (P24), with the fix computed from the weights and disk bandwidth."""

from __future__ import annotations

import json
import tempfile
from dataclasses import replace
from pathlib import Path

from typer.testing import CliRunner

import inferplane.cli.lint  # noqa: F401  (registers `lint` on the app)
from inferplane.cli.main import app
from inferplane.deploy.options import RenderOptions
from inferplane.doctor.lint import Advice
from inferplane.doctor.probes import find_engines, is_manifest_path, lint_manifests, load_time

DATA = Path(__file__).parent / "data"
MANIFESTS = DATA / "doctor" / "manifests"
MODELS = DATA / "models"
runner = CliRunner()


def _advice(name: str, disk_mib_s: float = 200.0) -> list[tuple[str, str, str, str]]:
    opts = replace(RenderOptions(), disk_read_mib_s=disk_mib_s)
    return [(a.severity, a.field.rsplit(": ", 1)[-1], a.message, a.fix)
            for a in lint_manifests(MANIFESTS / name, models_root=MODELS, options=opts)]


def test_vllm_guides_liveness_probe_without_startup_probe_kills_the_load() -> None:
    [(severity, probe, message, fix)] = _advice("vllm-docs-mistral.yaml")
    assert (severity, probe) == ("warn", "livenessProbe")
    # 60 s delay + 3 x 10 s; 13.5 GiB at 200 MiB/s + 240 s overhead = 310 s
    assert "kills the container after 90 s, loading takes ~310 s" in message
    assert "13.5 GiB of weights at 200 MiB/s" in message
    # the renderer's budget: 310 s x 1.5 = 465 -> 470 s, in 10 s periods
    assert fix.startswith("add startupProbe: {httpGet: {path: /health, port: 8000}, "
                          "periodSeconds: 10, failureThreshold: 47} (470 s)")


def test_the_fix_follows_the_disk_bandwidth_and_the_model() -> None:
    [(_, _, slow, slow_fix)] = _advice("vllm-docs-mistral.yaml", disk_mib_s=50)
    assert "loading takes ~517 s" in slow and "failureThreshold: 78" in slow_fix
    [(severity, probe, message, fix)] = _advice("qwen3-30b-a3b.yaml")
    # all experts load: 56.9 GiB, not the 3B active parameters (P04)
    assert (severity, probe) == ("warn", "startupProbe")
    assert "gives Qwen/Qwen3-30B-A3B 300 s, loading takes ~532 s" in message
    assert "56.9 GiB of weights" in message
    assert fix == ("startupProbe.failureThreshold: 80 (x periodSeconds 10 + "
                   "initialDelaySeconds 0 = 800 s)")


def test_near_miss_a_startup_probe_long_enough_and_a_tcp_ready_leader() -> None:
    assert _advice("qwen3-30b-a3b.near.yaml") == []
    assert _advice("lws-llama-70b.yaml") == []
    # the LWS leader's engine is found inside its shell string; the Ray worker is not vLLM
    [leader] = find_engines([MANIFESTS / "lws-llama-70b.yaml"])
    assert leader.workload == "LeaderWorkerSet/vllm (leader)"
    assert leader.model == "meta-llama/Llama-3.1-70B-Instruct"
    assert "--tensor-parallel-size" in leader.args


def test_a_probe_between_expected_and_recommended_is_info() -> None:
    text = (MANIFESTS / "qwen3-30b-a3b.yaml").read_text().replace(
        "failureThreshold: 30", "failureThreshold: 60")  # 600 s: > 532, < 800
    [(severity, _, message, fix)] = [(a.severity, a.field, a.message, a.fix)
                                     for a in _lint_text(text)]
    assert severity == "info" and "less than the 800 s" in message
    assert "failureThreshold: 80" in fix


def _lint_text(text: str) -> list[Advice]:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "m.yaml"
        path.write_text(text)
        return list(lint_manifests(path, models_root=MODELS))


def test_an_unknown_model_is_checked_against_the_overhead_alone() -> None:
    text = """\
apiVersion: v1
kind: Pod
metadata: {name: custom}
spec:
  containers:
  - name: engine
    image: vllm/vllm-openai:latest
    command: [python3, -m, vllm.entrypoints.openai.api_server, --model, /models/ours]
    startupProbe: {httpGet: {path: /health, port: 8000}, periodSeconds: 5, failureThreshold: 24}
    readinessProbe: {httpGet: {path: /health, port: 8000}}
"""
    [advice] = _lint_text(text)
    assert advice.severity == "warn"
    assert "gives /models/ours 120 s, loading takes ~240 s" in advice.message
    assert "weights not counted" in advice.message
    assert load_time(None, RenderOptions()).weights_gib is None


def test_no_readiness_probe_and_variables_for_the_model() -> None:
    text = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: env-model}
spec:
  template:
    spec:
      containers:
      - name: vllm
        args: ["vllm serve $(MODEL_ID) --port 9000"]
"""
    [advice] = _lint_text(text)
    assert advice.field.endswith("readinessProbe")
    assert "port: 9000" in advice.fix
    assert "the model is still loading" in advice.message


def test_cli_reads_a_directory_and_keeps_fleet_files_apart(tmp_path: Path) -> None:
    result = runner.invoke(app, ["lint", str(MANIFESTS), "--models-root", str(MODELS),
                                 "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["schema"] == "inferplane.lint/v1"
    assert sorted(a["field"].split(": ")[-1] for a in doc["advice"]) == [
        "livenessProbe", "startupProbe"]
    strict = runner.invoke(app, ["lint", str(MANIFESTS), "--models-root", str(MODELS),
                                 "--strict"])
    assert strict.exit_code == 1 and "P24 warn" in strict.output
    bad = runner.invoke(app, ["lint", str(MANIFESTS), "--disk-read-mib-s", "0"])
    assert bad.exit_code == 2 and "--disk-read-mib-s" in bad.output
    assert runner.invoke(app, ["lint", str(tmp_path / "missing.yaml")]).exit_code == 2
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("models: []\n")
    assert not is_manifest_path(fleet)
    assert is_manifest_path(MANIFESTS / "qwen3-30b-a3b.yaml")
