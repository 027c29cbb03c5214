"""`doctor --state-dir` says when a fleet already runs from that directory: `up` refuses it
then, so "writable" alone was a pass that `up` contradicted (found running doctor next to
the demo fleet)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from inferplane.doctor.checks import DoctorInput, check_state_dir
from inferplane.doctor.host import LocalHost


def test_a_live_up_in_the_state_dir_is_a_warning_naming_its_pid(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    # Stands in for `up`: StateDir.running_pid wants a live process named inferplane.
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "inferplane"])
    try:
        (state / "up.pid").write_text(f"{proc.pid}\n")
        check = check_state_dir(DoctorInput(LocalHost(), state_dir=state))
    finally:
        proc.kill()
        proc.wait()
    assert check.status == "warn", check
    assert f"pid {proc.pid}" in check.summary and "`up` refuses it" in check.summary
    assert check.fix is not None and f"inferplane down --state-dir {state}" in check.fix


def test_a_stale_pid_file_is_still_a_pass(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", "pass", "inferplane"])
    proc.wait()  # gone: its pid in the file is stale
    (state / "up.pid").write_text(f"{proc.pid}\n")
    check = check_state_dir(DoctorInput(LocalHost(), state_dir=state))
    assert check.status == "pass", check
    assert sorted(p.name for p in state.iterdir()) == ["up.pid"]  # doctor wrote nothing
