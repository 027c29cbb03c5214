"""Controlling a fleet from another shell: detach, wait until ready, stop, read status."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from inferplane.errors import InferplaneError
from inferplane.runtime.process import rotate_files
from inferplane.runtime.state import StateDir

if TYPE_CHECKING:  # the runtime pulls in the gateway, uvicorn and the store: import on use
    from inferplane.runtime.runner import RuntimeOptions
    from inferplane.spec import FleetSpec

SETTLED_STATES = ("ready", "failed")
Progress = Callable[[dict[str, Any]], None]


UP_LOG_ROTATE_BYTES = 16 * 2**20  # up.log beyond this becomes up.log.1 (while it runs too)
UP_LOG_BACKUPS = 3  # up.log.1 .. up.log.3 are kept: at most 64 MiB in all


def rotate_up_log(state: StateDir) -> None:
    """Keep up.log bounded: a log above UP_LOG_ROTATE_BYTES is rotated (up.log.1, ...)
    before a detached start appends to it, so the start's output begins at offset 0."""
    try:
        if state.up_log.stat().st_size > UP_LOG_ROTATE_BYTES:
            rotate_files(state.up_log, UP_LOG_BACKUPS)
    except OSError:
        pass


def log_size(state: StateDir) -> int:
    """Where the next detached start's output begins in up.log (rotated first)."""
    rotate_up_log(state)
    try:
        return state.up_log.stat().st_size
    except OSError:
        return 0


def spawn_detached(
    argv: Sequence[str], state: StateDir, env: Mapping[str, str] | None = None
) -> int:
    """Start `argv` (a foreground `inferplane up`) in its own session; its output goes
    through a pipe to the up.log writer (`inferplane.runtime.uplog`, a session of its own
    too), which rotates up.log by size while the fleet runs. `env`: added to this process's
    environment."""
    state.path.mkdir(parents=True, exist_ok=True)
    fd = os.open(state.up_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.fchmod(fd, 0o600)  # there at once (the writer takes a moment to start), private
    os.close(fd)
    read_end, write_end = os.pipe()
    try:
        subprocess.Popen(
            [sys.executable, "-m", "inferplane.runtime.uplog", str(state.up_log),
             str(UP_LOG_ROTATE_BYTES), str(UP_LOG_BACKUPS)],
            stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True,
        )  # fmt: skip
        os.close(read_end)
        read_end = -1
        proc = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=write_end, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True,
            env={**os.environ, **env} if env else None,
        )  # fmt: skip
    finally:
        if read_end != -1:
            os.close(read_end)
        os.close(write_end)
    return proc.pid


def _log_since(state: StateDir, offset: int) -> str:
    """up.log from `offset` on; when it was rotated since (it is shorter than `offset`),
    the rest of up.log.1 from there, then all of up.log."""
    parts = []
    try:
        if state.up_log.stat().st_size < offset:
            with open(state.up_log.with_name(state.up_log.name + ".1"), "rb") as older:
                older.seek(offset)
                parts.append(older.read())
            offset = 0
        with open(state.up_log, "rb") as log:
            log.seek(offset)
            parts.append(log.read())
    except OSError:
        pass
    return b"".join(parts).decode(errors="replace")


def start_failure(state: StateDir, offset: int, lines: int = 15) -> InferplaneError:
    """Why the detached `up` exited while starting, from what it wrote to up.log since
    `offset`: its own `error: ...` (reason and fix) when it printed one, else the log's end."""
    text = _log_since(state, offset)
    errors = [line[len("error:"):].strip() for line in text.splitlines()
              if line.startswith("error:")]  # fmt: skip
    if errors:
        return InferplaneError(f"{errors[-1]}\n(the fleet's log: {state.up_log})")
    tail = "\n".join(text.splitlines()[-lines:]) or "(nothing)"
    return InferplaneError(
        "the detached fleet exited while starting; its log ends with:\n" + tail,
        field="--state-dir", value=str(state.path),
        fix=f"read {state.up_log} and the instance logs under {state.log_dir}",
    )


def _exited(pid: int) -> bool:
    """True once `pid` (our child, or any process) has exited; reaps our child."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:  # not our child (or already reaped)
        return not _alive(pid)


def wait_detached_ready(
    state: StateDir, pid: int, timeout_s: float, log_offset: int = 0,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Poll `state.json` until the detached `up` reports every instance settled; each
    poll's state goes to `progress`. An exit while starting raises the child's own error."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _exited(pid):
            raise start_failure(state, log_offset)
        data = state.read()
        if data is not None and data.get("pid") == pid:
            if progress is not None:
                progress(data)
            if data.get("phase") == "running":
                return data
        time.sleep(0.1)
    raise InferplaneError(
        f"the fleet was not ready within {timeout_s:g} s", field="--state-dir",
        value=str(state.path), fix=f"see `inferplane status` and the logs under {state.log_dir}",
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has exited; only its parent has not reaped it yet (Linux /proc)
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def stop_starting(pid: int, timeout_s: float) -> bool:
    """Ctrl-C while a detached `up` starts: SIGTERM it (the runtime drains and stops what
    it started) and wait until it has exited. False when it is still there at the end."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout_s
    while not _exited(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


class Stopped(NamedTuple):
    """What `stop_fleet` saw: the `up` pid, and whether its process has exited."""

    pid: int
    exited: bool


def stop_fleet(
    state: StateDir, timeout_s: float, force: bool = False, progress: Progress | None = None
) -> Stopped:
    """Ask the `up` owning `state` to drain and stop (SIGTERM; SIGKILL-grade force with a
    second signal when `force`); wait until it exits, its state going to `progress` on every
    poll (phase "draining" with `gateway.in_flight`). `exited` is False when `up` released
    its state but its process was still there when `timeout_s` ran out."""
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
        data = state.read()
        if progress is not None and data is not None and data.get("phase") == "draining":
            progress(data)
        if time.monotonic() > deadline:
            raise InferplaneError(
                f"the fleet (pid {pid}) did not stop within {timeout_s:g} s",
                field="--timeout-s", value=timeout_s,
                fix="run `inferplane down --force`, or wait for long requests to finish",
            )
        time.sleep(0.1)
    # `up` releases its state before its interpreter has exited (atexit, engines' pipes):
    # "stopped" is said only once the process itself is gone.
    while _alive(pid):
        if time.monotonic() > deadline:
            return Stopped(pid, exited=False)
        time.sleep(0.05)
    return Stopped(pid, exited=True)


async def run_foreground(
    fleet: FleetSpec,
    options: RuntimeOptions,
    on_ready: Progress | None = None,
    on_progress: Progress | None = None,
    poll_s: float = 0.2,
) -> int:
    """`inferplane up` in the foreground: start, report, serve until signalled, drain.

    `on_progress` hears the fleet's status every `poll_s` while it starts and while it
    drains (`phase` "draining", `gateway.in_flight`), and once more when it has stopped."""
    from inferplane.runtime.runner import Runtime

    runtime = Runtime(fleet, options)
    await runtime.start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, runtime.request_stop)
    settle = asyncio.ensure_future(runtime.wait_settled())
    stop = asyncio.ensure_future(runtime.stop_requested())
    while not (settle.done() or stop.done()):
        if on_progress is not None:
            on_progress(runtime.status())
        await asyncio.wait({settle, stop}, timeout=poll_s, return_when=asyncio.FIRST_COMPLETED)
    if settle.done() and on_ready is not None:
        on_ready(runtime.status())
    settle.cancel()
    stop.cancel()
    serving = asyncio.ensure_future(runtime.serve_until_signalled())
    if on_progress is not None:
        stop = asyncio.ensure_future(runtime.stop_requested())
        await asyncio.wait({serving, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        while not serving.done():
            on_progress(runtime.status())
            await asyncio.wait({serving}, timeout=poll_s)
        on_progress(runtime.status())
    return await serving


def python_argv() -> list[str]:
    return [sys.executable, "-m", "inferplane"]


def resolve_state_dir(path: Path) -> StateDir:
    return StateDir(path.resolve())
