"""`inferplane monitoring FLEET --out DIR` works while other fleets run: it used to refuse
("2 fleets are running") although FLEET names what to write; it takes the live targets of
the fleet started from FLEET, else FLEET's plan (found with two demo fleets up)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferplane.cli.main import _register_commands, app
from inferplane.errors import InferplaneError
from inferplane.runtime.registry import register
from inferplane.runtime.state import StateDir

MODELS = Path(__file__).parent / "data" / "models"


def _fleet(path: Path) -> Path:
    path.write_text(
        "engine: vllm\ngpus:\n  nodes:\n    - {name: n, gpu_type: L40S, count: 1}\n"
        f"models:\n  - name: chat\n    source: {MODELS / 'Qwen--Qwen2.5-7B-Instruct'}\n"
        "    max_model_len: 4096\n")  # fmt: skip
    return path


@pytest.fixture()
def two_running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Path]]:
    """Two state directories held by live processes named inferplane (stand-ins for `up`)."""
    monkeypatch.setenv("INFERPLANE_REGISTRY_DIR", str(tmp_path / "registry"))
    monkeypatch.delenv("INFERPLANE_STATE_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    procs, fleets = [], []
    try:
        for name in ("a", "b"):
            proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                                     "inferplane"])  # fmt: skip
            procs.append(proc)
            fleet = _fleet(tmp_path / f"{name}.yaml")
            state = StateDir(tmp_path / f"state-{name}")
            (state.path / "monitoring" / "targets").mkdir(parents=True)
            state.pid_file.write_text(f"{proc.pid}\n")
            state.state_file.write_text(json.dumps({
                "fleet": str(fleet.resolve()), "monitoring_dir": str(state.path / "monitoring"),
                "gateway": {"url": "http://127.0.0.1:18999"}, "instances": []}))
            register(state, proc.pid)
            fleets.append(fleet)
        yield fleets
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _monitoring(*args: str) -> tuple[int, str, BaseException | None]:
    _register_commands()
    result = CliRunner().invoke(app, ["monitoring", *args])
    return result.exit_code, result.output, result.exception


def test_a_fleet_file_not_running_gets_its_planned_files(
    two_running: list[Path], tmp_path: Path
) -> None:
    other = _fleet(tmp_path / "other.yaml")
    code, out, exc = _monitoring(str(other), "--out", str(tmp_path / "out"))
    assert code == 0 and exc is None, out
    assert "live files" not in out and (tmp_path / "out" / "rules.yml").is_file()
    assert (tmp_path / "out" / "targets" / "engines.json").is_file()  # from the plan's ports


def test_a_running_fleets_file_gets_its_live_targets(
    two_running: list[Path], tmp_path: Path
) -> None:
    code, out, _ = _monitoring(str(two_running[1]), "--out", str(tmp_path / "out"))
    assert code == 0, out
    assert f"live files in {tmp_path / 'state-b' / 'monitoring' / 'targets'}" in out


def test_without_a_fleet_file_the_choice_is_still_the_users(
    two_running: list[Path], tmp_path: Path
) -> None:
    _, _, exc = _monitoring("--out", str(tmp_path / "out"))
    assert isinstance(exc, InferplaneError) and "2 fleets are running" in exc.message
