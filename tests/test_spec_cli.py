"""`inferplane validate`: summaries, every error with file:line, `--json`, and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from inferplane.cli import main as cli_main

cli_main._register_commands()
runner = CliRunner()

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
BROKEN = ROOT / "tests" / "data" / "fleets" / "broken"
ERROR_KEYS = {"line", "column", "field", "value", "message", "fix"}
SUMMARY_KEYS = {
    "engine",
    "models",
    "placed_models",
    "endpoint_models",
    "replicas",
    "endpoints",
    "gpus",
    "nodes",
    "device",
}


def test_examples_validate_with_a_summary_each() -> None:
    result = runner.invoke(cli_main.app, ["validate", *map(str, EXAMPLES)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == len(EXAMPLES)
    s4 = next(line for line in lines if "s4-deepseek-qwen-mix.yaml" in line)
    assert s4.startswith("ok ")
    assert "3 models (3 placed, 0 endpoint-only), 3 replicas" in s4
    assert "16 GPUs on 2 nodes, engine vllm 0.26.0" in s4


def test_invalid_file_exits_2_listing_every_problem() -> None:
    path = BROKEN / "top_level_typo.yaml"
    result = runner.invoke(cli_main.app, ["validate", str(path)])
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0] == f"invalid {path}: 2 problems"
    assert lines[1].strip().startswith(f"{path}:2:1: models: missing required key 'models'")
    assert lines[2].strip().endswith("Fix: did you mean 'models'?")


def test_json_is_one_object_per_file_with_a_stable_schema() -> None:
    good = ROOT / "examples" / "endpoints-only.yaml"
    bad = BROKEN / "unknown_key.yaml"
    result = runner.invoke(cli_main.app, ["validate", "--json", str(good), str(bad)])
    assert result.exit_code == 2
    objects = [json.loads(line) for line in result.stdout.splitlines()]
    assert [o["file"] for o in objects] == [str(good), str(bad)]
    for obj in objects:
        assert set(obj) == {"file", "valid", "errors", "summary"}
    ok, broken = objects
    assert ok["valid"] is True and ok["errors"] == []
    assert set(ok["summary"]) == SUMMARY_KEYS
    assert ok["summary"]["endpoints"] == 1 and ok["summary"]["gpus"] is None
    assert broken["valid"] is False and broken["summary"] is None
    (error,) = broken["errors"]
    assert set(error) == ERROR_KEYS
    assert error == {
        "line": 5,
        "column": 5,
        "field": "models[0].tensor_paralel_size",
        "value": 2,
        "message": "unknown key 'tensor_paralel_size'",
        "fix": "did you mean 'tensor_parallel_size'?",
    }


def test_json_for_every_broken_file_is_valid_json_with_errors() -> None:
    paths = sorted(BROKEN.glob("*.yaml"))
    result = runner.invoke(cli_main.app, ["validate", "--json", *map(str, paths)])
    assert result.exit_code == 2
    objects = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(objects) == len(paths)
    for obj in objects:
        assert obj["valid"] is False and obj["errors"], obj["file"]
        assert all(set(error) == ERROR_KEYS and error["fix"] for error in obj["errors"])


def test_missing_file_is_reported_not_a_traceback(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    result = runner.invoke(cli_main.app, ["validate", "--json", str(missing)])
    assert result.exit_code == 2
    (error,) = json.loads(result.stdout)["errors"]
    assert (error["line"], error["message"]) == (None, "file not found")


def test_installed_entry_point_exit_codes() -> None:
    cmd = [sys.executable, "-m", "inferplane", "validate"]
    ok = subprocess.run([*cmd, str(ROOT / "examples" / "endpoints-only.yaml")], capture_output=True)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run(
        [*cmd, str(BROKEN / "duplicate_yaml_key.yaml")], capture_output=True, text=True
    )
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr
    assert "duplicate_yaml_key.yaml:7:5: models[0].replicas: key 'replicas' appears twice" in (
        bad.stderr
    )
