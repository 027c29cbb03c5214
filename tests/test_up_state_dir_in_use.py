"""`up` on a state directory another live `up` holds refuses before it plans: the refusal
used to come after the plan's tables and every P09 warning (found running the demo twice)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).parent.parent / "examples" / "demo.yaml"


def test_up_refuses_a_held_state_dir_before_printing_the_plan(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    # Stands in for the first `up`: StateDir.running_pid wants a live process named inferplane.
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                               "inferplane"])  # fmt: skip
    try:
        (state / "up.pid").write_text(f"{holder.pid}\n")
        for mode in (["--detach"], []):
            result = subprocess.run(
                [sys.executable, "-m", "inferplane", "up", str(DEMO), "--state-dir", str(state),
                 *mode], capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
            output = result.stdout + result.stderr
            assert result.returncode == 2, (mode, output)
            assert f"already running from this state directory (pid {holder.pid})" in output
            assert "GPUs used" not in output and "P09" not in output, mode
    finally:
        holder.kill()
        holder.wait()
    assert sorted(p.name for p in state.iterdir()) == ["up.pid"]  # nothing started or written
