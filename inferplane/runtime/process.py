"""Starting and stopping engine processes: own process group, output to a rotating log.

Every engine runs in its own session (process group), so stopping it signals the whole
group and nothing it forked is orphaned. On Linux each child also asks the kernel to
SIGKILL it when the supervisor dies (PR_SET_PDEATHSIG), so even `kill -9` of `up` leaves
no engine behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fnmatch
import os
import signal
import sys
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from inferplane.runtime import state as _state

# Never handed to engines: the gateway's own secrets and settings (admin token, database
# and Redis URLs: every INFERPLANE_* variable) and database passwords. Engines keep the rest
# of the environment (CUDA_*, HF_*, VLLM_*, PATH, ...), which vLLM needs.
ENGINE_ENV_DROP_PREFIXES = ("INFERPLANE_",)
ENGINE_ENV_DROP = frozenset({"PGPASSWORD", "PGPASSFILE", "REDISCLI_AUTH"})

LOG_MAX_BYTES = 10 * 2**20
_STREAM_LIMIT = 2**16  # asyncio's default line limit for subprocess pipes
LOG_BACKUPS = 3
_PR_SET_PDEATHSIG = 1


def _child_setup() -> None:
    """Runs in the child between fork and exec (Linux: die with the parent; the
    operator's own umask, not the state directory's private one)."""
    if _state.OPERATOR_UMASK is not None:
        os.umask(_state.OPERATOR_UMASK)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class RotatingLog:
    """Appends text to `path`; past `max_bytes` it becomes `path.1` (older: `.2`, ...),
    keeping `backups` old files."""

    def __init__(self, path: Path, max_bytes: int = LOG_MAX_BYTES, backups: int = LOG_BACKUPS):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self._file = _open_private(path)
        self._size = self._file.tell()
        self.dropped = 0  # lines lost to a write error (a full disk): never fatal

    def _rotate(self) -> None:
        self._file.close()
        rotate_files(self.path, self.backups)
        self._file = _open_private(self.path)
        self._size = 0

    def write(self, text: str) -> None:
        """Append `text`; a write error (ENOSPC: the state disk is full) drops it and is
        counted, so a full disk never keeps an engine from being restarted."""
        if self._file.closed:
            return
        size = len(text.encode("utf-8", "replace"))
        try:
            if self._size and self._size + size > self.max_bytes:
                self._rotate()
            self._file.write(text)
            self._file.flush()
        except OSError:
            self.dropped += 1
            with contextlib.suppress(OSError):
                self._file = _reopen(self._file, self.path)
            return
        self._size += size

    def close(self) -> None:
        self._file.close()


def rotate_files(path: Path, backups: int) -> None:
    """`path` becomes `path.1`, `path.1` becomes `path.2`, ... keeping `backups` old files
    (none: `path` is removed)."""
    for n in range(backups - 1, 0, -1):
        older = path.with_name(f"{path.name}.{n}")
        if older.exists():
            os.replace(older, path.with_name(f"{path.name}.{n + 1}"))
    if backups > 0:
        os.replace(path, path.with_name(f"{path.name}.1"))
    else:
        path.unlink(missing_ok=True)


def _reopen(old: TextIO, path: Path) -> TextIO:
    """A fresh handle after a failed write (its buffer may hold the unwritten text)."""
    with contextlib.suppress(OSError):
        old.close()
    return _open_private(path)


def _open_private(path: Path) -> TextIO:
    """Append to `path`, created readable by its owner only (0600): logs may hold prompts
    an engine echoes, paths and tokens."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with contextlib.suppress(OSError):
        os.fchmod(fd, 0o600)  # an older file keeps its mode through O_CREAT
    return os.fdopen(fd, "a", encoding="utf-8")


ENGINE_ENV_ALLOW = "INFERPLANE_ENGINE_ENV_ALLOW"  # e.g. "PATH,HOME,CUDA_*,HF_*,VLLM_*"


def engine_environment(
    env: Mapping[str, str], hidden: Collection[str] = ()
) -> dict[str, str]:
    """Our environment without the gateway's secrets (and `hidden` names, e.g. the fleet's
    `gateway.admin_token_env`), with the engine's own `env` on top. With
    $INFERPLANE_ENGINE_ENV_ALLOW (comma-separated names or shell patterns) only matching
    variables of ours are passed on (docs/runtime.md)."""
    allow = [p.strip() for p in os.environ.get(ENGINE_ENV_ALLOW, "").split(",") if p.strip()]
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(ENGINE_ENV_DROP_PREFIXES) and k not in ENGINE_ENV_DROP
        and k not in hidden and (not allow or any(fnmatch.fnmatchcase(k, p) for p in allow))
    }  # fmt: skip
    return {**base, **env}


def stopped(pid: int) -> bool:
    """Whether `pid` is stopped (SIGSTOP, a debugger): it cannot act on SIGTERM."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] in (b"T", b"t")
    except (OSError, IndexError):
        return False


# After the engine process itself exited, how long its output pipe may stay open (its
# process group is being killed) before the supervisor closes it: a grandchild that left
# the group would otherwise hold it, and the restart, forever.
PIPE_GRACE_S = 5.0


class _ExitProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's protocol, also telling when the engine process itself exited: on 3.11
    `Process.wait()` returns only once every pipe has closed, and real vLLM's EngineCore
    and worker processes hold the API server's stdout open after it died (kill -9)."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exited = asyncio.Event()

    def process_exited(self) -> None:
        super().process_exited()
        self.exited.set()


class EngineProcess:
    """One running engine process, its output pumped into a rotating log file."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        log: RotatingLog,
        exited: asyncio.Event | None = None,
        transport: asyncio.SubprocessTransport | None = None,
    ) -> None:
        self.proc = proc
        self.log = log
        self._exited = exited
        self._transport = transport
        self._pump = asyncio.get_running_loop().create_task(self._copy_output())

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    async def _copy_output(self) -> None:
        stream = self.proc.stdout
        if stream is None:
            return
        while True:
            line = await stream.readline()
            if not line:
                return
            self.log.write(line.decode("utf-8", "replace"))

    async def exited(self) -> int:
        """The engine process's exit code, as soon as it exited: its children (still in
        its process group until `stop` kills them) may hold its output open longer."""
        if self._exited is None:
            return await self.proc.wait()
        await self._exited.wait()
        code = self.proc.returncode
        assert code is not None  # set before process_exited is called
        return code

    async def wait(self) -> int:
        """The exit code once the process exited and its output was all copied (the pipe
        closed, or `PIPE_GRACE_S` passed: then it is closed here)."""
        code = await self.exited()
        if not self._pump.done():
            # asyncio.wait never raises the pump's own end (even a cancelled pump), while a
            # cancellation of *this* task still propagates: suppressing CancelledError here
            # swallowed Supervisor.stop()'s cancel, so a restart went on during shutdown.
            done, _ = await asyncio.wait([self._pump], timeout=PIPE_GRACE_S)
            if not done and self._transport is not None:
                self.log.write("--- output pipe still open after the engine exited (a child "
                               "outside its process group?): closed\n")
                self._transport.close()
                await asyncio.wait([self._pump])
        return code

    def signal_group(self, sig: int) -> None:
        """Send `sig` to the engine's whole process group (nothing if already gone)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    async def stop(self, timeout_s: float) -> int:
        """SIGTERM the group, then SIGKILL it after `timeout_s`; returns the exit code."""
        if self.proc.returncode is None and stopped(self.proc.pid):
            timeout_s = 0.0  # a stopped process cannot run its SIGTERM handler: no grace
        if self.proc.returncode is None and timeout_s > 0:
            self.signal_group(signal.SIGTERM)
            # asyncio.wait, not wait_for: on 3.11 wait_for swallows a cancellation that
            # arrives as the process exits, and the supervisor then restarted an engine
            # while shutting down.
            waiter = asyncio.ensure_future(self.exited())
            try:
                done, _ = await asyncio.wait({waiter}, timeout=timeout_s)
            except asyncio.CancelledError:
                waiter.cancel()
                raise
            if not done:
                waiter.cancel()
        # Also after the process exited by itself (kill -9, a crash): its children (vLLM's
        # EngineCore and workers) are still in the group, holding RAM, cores and the log.
        self.signal_group(signal.SIGKILL)
        return await self.wait()


async def spawn(
    argv: Sequence[str],
    env: Mapping[str, str],
    log: RotatingLog,
    cwd: Path | None = None,
    hidden: Collection[str] = (),
) -> EngineProcess:
    """Start `argv` in its own process group with `env` merged over ours, minus the
    gateway's secrets (`engine_environment`)."""
    log.write(f"--- starting: {' '.join(argv)}\n")
    loop = asyncio.get_running_loop()
    # asyncio.create_subprocess_exec, with a protocol that also reports the exit itself
    transport, protocol = await loop.subprocess_exec(
        lambda: _ExitProtocol(_STREAM_LIMIT, loop),
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=engine_environment(env, hidden),
        cwd=cwd,
        start_new_session=True,
        preexec_fn=_child_setup,
    )
    proc = asyncio.subprocess.Process(transport, protocol, loop)
    return EngineProcess(proc, log, protocol.exited, transport)


def raise_nofile_limit(wanted: int = 65536) -> tuple[int, int]:
    """Raise this process's open-files soft limit (inherited by engines) toward `wanted`,
    capped by the hard limit (P30: `ulimit -n` 1024 -> "Too many open files").
    Returns the (soft, hard) limits now in force."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft, hard
