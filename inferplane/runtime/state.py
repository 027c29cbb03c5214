"""The state directory of a running fleet: pid file, `state.json`, per-instance logs.

Another shell reads it for `inferplane status` and `inferplane down`; a second `up` on
the same directory refuses while the first is alive.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import psutil

from inferplane.errors import InferplaneError

DEFAULT_STATE_DIR = Path(".inferplane")


class StateDir:
    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def pid_file(self) -> Path:
        return self.path / "up.pid"

    @property
    def state_file(self) -> Path:
        return self.path / "state.json"

    @property
    def log_dir(self) -> Path:
        return self.path / "logs"

    @property
    def up_log(self) -> Path:
        return self.path / "up.log"

    def running_pid(self) -> int | None:
        """The pid of the live `up` owning this directory, or None."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        try:
            proc = psutil.Process(pid)
            alive = proc.status() != psutil.STATUS_ZOMBIE
            cmdline = " ".join(proc.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None
        # A recycled pid belongs to some other program: not ours.
        return pid if alive and "inferplane" in cmdline else None

    def claim(self) -> None:
        """Take the directory for this process; refuse if another `up` holds it."""
        other = self.running_pid()
        if other is not None and other != os.getpid():
            raise InferplaneError(
                f"a fleet is already running from this state directory (pid {other})",
                field="--state-dir",
                value=str(self.path),
                fix="stop it with `inferplane down`, or pass another --state-dir",
            )
        # Private (0700): state, logs and the database URL are the owner's only; every
        # file this process creates from now on (the SQLite DB and its WAL, logs, plans)
        # is 0600. Engines get the operator's own umask back (runtime.process).
        private_umask()
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        for directory in (self.path, self.log_dir):
            with contextlib.suppress(OSError):
                os.chmod(directory, 0o700)
        _write_private(self.pid_file, f"{os.getpid()}\n")

    def release(self) -> None:
        if self.running_pid() in (None, os.getpid()):
            self.pid_file.unlink(missing_ok=True)

    def write(self, state: dict[str, Any]) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        _write_private(tmp, json.dumps(state, indent=2) + "\n")
        os.replace(tmp, self.state_file)

    def read(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None


OPERATOR_UMASK: int | None = None  # the umask before `private_umask`, for engines


def private_umask() -> None:
    """Create files 0600 and directories 0700 from now on (once per process)."""
    global OPERATOR_UMASK
    if OPERATOR_UMASK is None:
        OPERATOR_UMASK = os.umask(0o077)


def _write_private(path: Path, text: str) -> None:
    """Write `text` to `path` readable by its owner only (0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    with contextlib.suppress(OSError):
        os.chmod(path, 0o600)  # an older file keeps its mode through O_CREAT
