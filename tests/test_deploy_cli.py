"""`inferplane render` and `inferplane render --check` through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

from deploy_plans import s4
from typer.testing import CliRunner

from inferplane.cli.main import _register_commands, app

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()
_register_commands()


def test_render_with_saved_plan_then_check(tmp_path: Path) -> None:
    fleet_file = tmp_path / "s4.yaml"
    _, plan, text = s4()
    fleet_file.write_text(text)
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(plan.model_dump_json())
    out = tmp_path / "out"
    result = runner.invoke(app, ["render", str(fleet_file), "--plan", str(plan_file),
                                 "--out", str(out), "--namespace", "llm", "--json"])
    assert result.exit_code == 0, result.output
    assert "kustomization.yaml" in json.loads(result.output)["files"]
    check = runner.invoke(app, ["render", "--check", str(out), "--json"])
    assert check.exit_code == 0, check.output
    assert json.loads(check.output)["valid"] is True
    dep = out / "engines/qwen3-8b/deployment.yaml"
    dep.write_text(dep.read_text().replace("maxSurge: 0", "maxSurge: 1"))
    bad = runner.invoke(app, ["render", "--check", str(out)])
    assert bad.exit_code == 2
    assert "maxSurge: 0" in bad.output


def test_render_weights_and_gang_options(tmp_path: Path) -> None:
    fleet_file = tmp_path / "s4.yaml"
    _, plan, text = s4()
    fleet_file.write_text(text)
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(plan.model_dump_json())
    out = tmp_path / "out"
    result = runner.invoke(app, ["render", str(fleet_file), "--plan", str(plan_file),
                                 "--out", str(out), "--weights", "prewarm", "--gang",
                                 "volcano", "--gang-queue", "llm", "--json"])
    assert result.exit_code == 0, result.output
    files = json.loads(result.output)["files"]
    assert "models/deepseek-r1/prewarm.yaml" in files
    assert "engines/deepseek-r1/podgroup.yaml" in files
    assert runner.invoke(app, ["render", "--check", str(out)]).exit_code == 0
    pvc_out = tmp_path / "pvc"
    result = runner.invoke(app, ["render", str(fleet_file), "--plan", str(plan_file),
                                 "--out", str(pvc_out), "--weights", "pvc",
                                 "--weights-storage-class", "nfs-ro", "--gang", "kueue"])
    assert result.exit_code == 0, result.output
    assert "storageClassName: nfs-ro" in (pvc_out / "models/qwen3-8b/pvc.yaml").read_text()
    from inferplane.errors import InferplaneError

    for flag, value in (("--weights", "nfs"), ("--gang", "yunikorn")):
        bad = runner.invoke(app, ["render", str(fleet_file), "--plan", str(plan_file),
                                  "--out", str(tmp_path / "bad"), flag, value])
        assert isinstance(bad.exception, InferplaneError)
        assert bad.exception.field == flag and bad.exception.value == value


def test_render_plans_the_example_itself(tmp_path: Path) -> None:
    out = tmp_path / "compose"
    result = runner.invoke(app, ["render", str(REPO / "examples/s0-l40s-colocated.yaml"),
                                 "--target", "compose", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "l40s-node-1/compose.yaml").is_file()


def test_render_errors(tmp_path: Path) -> None:
    from inferplane.errors import InferplaneError

    bad_plan = tmp_path / "plan.json"
    bad_plan.write_text('{"schema_version": 1}')
    result = runner.invoke(app, ["render", str(REPO / "examples/s0-l40s-colocated.yaml"),
                                 "--plan", str(bad_plan), "--out", str(tmp_path / "o")])
    assert isinstance(result.exception, InferplaneError)
    assert "not a valid plan" in str(result.exception)
    result = runner.invoke(app, ["render", "--check", str(tmp_path)])
    assert isinstance(result.exception, InferplaneError)
    assert "no rendered files" in str(result.exception)
    result = runner.invoke(app, ["render", str(REPO / "examples/s0-l40s-colocated.yaml")])
    assert isinstance(result.exception, InferplaneError)


def test_apply_refuses_without_cluster(tmp_path: Path, monkeypatch: object) -> None:
    import pytest

    pytest.importorskip("kubernetes")
    from inferplane.errors import InferplaneError

    mp = monkeypatch
    assert isinstance(mp, pytest.MonkeyPatch)
    mp.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    mp.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    _, plan, text = s4()
    fleet_file = tmp_path / "s4.yaml"
    fleet_file.write_text(text)
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(plan.model_dump_json())
    out = tmp_path / "out"
    assert runner.invoke(app, ["render", str(fleet_file), "--plan", str(plan_file),
                               "--out", str(out)]).exit_code == 0
    result = runner.invoke(app, ["apply", str(out), "--dry-run"])
    assert isinstance(result.exception, InferplaneError)
    assert "no Kubernetes cluster is configured" in str(result.exception)
    result = runner.invoke(app, ["apply", str(tmp_path)])
    assert isinstance(result.exception, InferplaneError)
    assert "not a rendered Kubernetes directory" in str(result.exception)
