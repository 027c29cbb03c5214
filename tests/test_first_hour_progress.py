"""What `up` says while it works (issue 18, item 3): per instance starting → loading →
ready, then "draining N in-flight requests" on Ctrl-C; piped, one line per change."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from inferplane.cli.progress import FleetProgress, instance_phase


def _inst(
    name: str, state: str, pid: int | None = None, error: str | None = None
) -> dict[str, Any]:
    return {"name": name, "state": state, "pid": pid, "port": 9000, "last_error": error}


def _status(phase: str, *instances: dict[str, Any], in_flight: int = 0) -> dict[str, Any]:
    return {"phase": phase, "instances": list(instances), "grace_period_s": 30.0,
            "gateway": {"in_flight": in_flight}}  # fmt: skip


def test_phases_from_the_supervisor_record() -> None:
    assert instance_phase(_inst("a", "starting")) == "starting"  # waiting for its turn
    assert instance_phase(_inst("a", "starting", pid=7)) == "loading"  # spawned, not ready
    assert instance_phase(_inst("a", "ready", pid=7)) == "ready"
    assert instance_phase(_inst("a", "failed")) == "failed"


def test_piped_progress_prints_one_line_per_change_then_the_drain() -> None:
    out = io.StringIO()
    progress = FleetProgress(Console(file=out, width=80, force_terminal=False))
    progress.update(_status("starting", _inst("a", "starting"), _inst("b", "starting")))
    progress.update(_status("starting", _inst("a", "starting", 11), _inst("b", "starting")))
    progress.update(_status("starting", _inst("a", "starting", 11), _inst("b", "starting")))
    progress.update(_status("starting", _inst("a", "ready", 11),
                            _inst("b", "failed", error="exited with code 1 while starting")))
    progress.update(_status("draining", in_flight=3))
    progress.update(_status("draining", in_flight=3))
    progress.update(_status("stopped"))
    lines = out.getvalue().splitlines()
    assert lines[:3] == ["a: starting", "b: starting", "a: loading (pid 11, port 9000)"]
    assert lines[3].startswith("a: ready after ")
    assert lines[4].startswith("b: failed after ") and lines[4].endswith(
        ": exited with code 1 while starting")
    assert lines[5:] == [
        "draining 3 in-flight requests (grace period 30 s); Ctrl-C again forces",
        "drained; engines and gateway stopped",
    ]


def test_terminal_progress_is_a_live_block() -> None:
    out = io.StringIO()
    progress = FleetProgress(Console(file=out, width=80, force_terminal=True))
    progress.update(_status("starting", _inst("a", "starting", 11), _inst("b", "starting")))
    progress.close()
    text = out.getvalue()
    assert "starting 2 engines (1 loading, 1 starting)" in text
    assert "loading" in text and "\x1b[" in text  # redrawn in place


def test_foreground_up_reports_loading_ready_and_the_drain(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("engine: sim\nmodels:\n  - name: chat\n    source: Qwen/Qwen3-0.6B\n"
                     "    max_model_len: 4096\n")  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "inferplane", "up", str(fleet), "--state-dir",
         str(tmp_path / "state"), "--gateway-port", "0", "--no-tenancy"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + 60
    try:
        for line in proc.stdout:
            seen.append(line.rstrip("\n"))
            if line.startswith("serving;"):
                break
            assert time.monotonic() < deadline, seen
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    seen += rest.splitlines()
    text = "\n".join(seen)
    assert proc.returncode == 0, text
    assert "chat-0: loading (pid " in text and "chat-0: ready after " in text
    assert seen.index(next(x for x in seen if x.startswith("chat-0: ready"))) < seen.index(
        next(x for x in seen if x.startswith("serving;")))
    assert "draining 0 in-flight requests (grace period" in text
    assert "drained; engines and gateway stopped" in text
