"""The first hour of a new user (issue 18): what the CLI prints when things go wrong or
take long, run as a user runs it (a subprocess, output piped)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ENDPOINT_FLEET = 'models:\n  - name: m\n    endpoints: ["http://127.0.0.1:9"]\n'


def _cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
         timeout: float = 60) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "inferplane", *args], capture_output=True, text=True,
        timeout=timeout, cwd=cwd, env={**os.environ, "NO_COLOR": "1", **(env or {})},
    )  # fmt: skip


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield int(sock.getsockname()[1])


def test_failed_background_start_prints_the_reason_and_fix_exit_2(
    tmp_path: Path, taken_port: int
) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(ENDPOINT_FLEET)
    state = tmp_path / "state"
    proc = _cli("up", str(fleet), "--detach", "--state-dir", str(state),
                "--gateway-port", str(taken_port), "--no-tenancy")  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "ChildProcessError" not in proc.stderr
    # the child's own error, on one line: the reason, the value and the fix
    line = next(x for x in proc.stderr.splitlines() if x.startswith("error:"))
    assert f"cannot listen on 127.0.0.1:{taken_port}" in line
    assert "Fix: stop what uses that port" in line
    assert str(state / "up.log") in proc.stderr


def test_demo_script_with_a_taken_port_exits_2_with_the_reason(
    tmp_path: Path, taken_port: int
) -> None:
    venv_cli = REPO / ".venv" / "bin" / "inferplane"
    if not venv_cli.exists():
        pytest.skip("scripts/demo.sh runs from .venv")
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "demo.sh")], capture_output=True, text=True,
        timeout=120, env={**os.environ, "NO_COLOR": "1", "PORT": str(taken_port),
                          "STATE_DIR": str(tmp_path / "demo")},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"cannot listen on 127.0.0.1:{taken_port}" in proc.stderr
    assert "Fix:" in proc.stderr
