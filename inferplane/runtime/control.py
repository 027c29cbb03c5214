"""Controlling a fleet from another shell: detach, wait until ready, stop, read status."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from inferplane.errors import InferplaneError
from inferplane.runtime.runner import Runtime, RuntimeOptions
from inferplane.runtime.state import StateDir
from inferplane.spec import FleetSpec

SETTLED_STATES = ("ready", "failed")


def spawn_detached(argv: Sequence[str], state: StateDir) -> int:
    """Start `argv` (a foreground `inferplane up`) in its own session, output to up.log."""
    state.path.mkdir(parents=True, exist_ok=True)
    with open(state.up_log, "ab") as log:
        proc = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True,
        )
    return proc.pid


def _log_tail(state: StateDir, lines: int = 15) -> str:
    try:
        return "\n".join(state.up_log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_detached_ready(state: StateDir, pid: int, timeout_s: float) -> dict[str, Any]:
    """Poll `state.json` until the detached `up` reports every instance settled."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        finished = os.waitpid(pid, os.WNOHANG)[0] == pid if _is_child(pid) else not _alive(pid)
        if finished:
            raise InferplaneError(
                "the detached fleet exited while starting; its log ends with:\n"
                + _log_tail(state),
                field="--state-dir", value=str(state.path),
                fix=f"read {state.up_log} and the instance logs under {state.log_dir}",
            )
        data = state.read()
        if data is not None and data.get("pid") == pid and data.get("phase") == "running":
            return data
        time.sleep(0.1)
    raise InferplaneError(
        f"the fleet was not ready within {timeout_s:g} s", field="--state-dir",
        value=str(state.path), fix=f"see `inferplane status` and the logs under {state.log_dir}",
    )


def _is_child(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_fleet(state: StateDir, timeout_s: float, force: bool = False) -> int:
    """Ask the `up` owning `state` to drain and stop (SIGTERM; SIGKILL-grade force with a
    second signal when `force`); wait until it exits. Returns its pid."""
    pid = state.running_pid()
    if pid is None:
        raise InferplaneError(
            "no fleet is running from this state directory", field="--state-dir",
            value=str(state.path),
            fix="start one with `inferplane up FLEET.yaml --detach`, or pass its --state-dir",
        )
    os.kill(pid, signal.SIGTERM)
    if force:
        time.sleep(0.2)
        os.kill(pid, signal.SIGTERM)  # a second signal forces
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and state.running_pid() == pid:
        if time.monotonic() > deadline:
            raise InferplaneError(
                f"the fleet (pid {pid}) did not stop within {timeout_s:g} s",
                field="--timeout-s", value=timeout_s,
                fix="run `inferplane down --force`, or wait for long requests to finish",
            )
        time.sleep(0.1)
    return pid


async def run_foreground(
    fleet: FleetSpec,
    options: RuntimeOptions,
    on_ready: Callable[[dict[str, Any]], None] | None = None,
) -> int:
    """`inferplane up` in the foreground: start, report, serve until signalled, drain."""
    runtime = Runtime(fleet, options)
    await runtime.start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, runtime.request_stop)
    settle = asyncio.ensure_future(runtime.wait_settled())
    stop = asyncio.ensure_future(runtime.stop_requested())
    await asyncio.wait({settle, stop}, return_when=asyncio.FIRST_COMPLETED)
    if settle.done() and on_ready is not None:
        on_ready(runtime.status())
    settle.cancel()
    stop.cancel()
    return await runtime.serve_until_signalled()


def python_argv() -> list[str]:
    return [sys.executable, "-m", "inferplane"]


def resolve_state_dir(path: Path) -> StateDir:
    return StateDir(path.resolve())
