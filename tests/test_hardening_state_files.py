"""Issue 30 items 8, 14 and 18: private state files (the SQLite DB and its WAL, logs,
plans), engines given the operator's umask and, on request, an allow-listed environment;
up.log bounded; a stopped engine killed without a SIGTERM grace it cannot use."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from inferplane.runtime import control
from inferplane.runtime.process import EngineProcess, RotatingLog, engine_environment, stopped
from inferplane.runtime.state import StateDir
from inferplane.store import Store


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_the_sqlite_database_and_its_wal_are_0600(tmp_path: Path) -> None:
    store = await Store.open(f"sqlite:///{tmp_path / 'state' / 'inferplane.db'}")
    async with store.session() as s:  # opens the WAL and shared-memory files
        from sqlalchemy import text

        await s.execute(text("SELECT 1"))
        files = sorted(p for p in (tmp_path / "state").iterdir())
        assert [p.name for p in files][:1] == ["inferplane.db"]
        assert all(mode(p) == 0o600 for p in files), {p.name: oct(mode(p)) for p in files}
    await store.close()


def test_files_an_up_process_creates_are_private_and_engines_get_the_operator_umask(
    tmp_path: Path,
) -> None:
    """In a child process: claim() changes the process umask, so run it apart."""
    script = textwrap.dedent(
        f"""
        import asyncio, os, stat, sys
        from pathlib import Path
        os.umask(0o022)
        from inferplane.runtime.state import StateDir
        from inferplane.runtime.process import RotatingLog, spawn
        state = StateDir(Path({str(tmp_path / 'state')!r}))
        state.claim()
        (state.path / "plan.json").write_text("{{}}")
        async def main():
            log = RotatingLog(state.log_dir / "engine.log")
            proc = await spawn([sys.executable, "-c", "import os; print(oct(os.umask(0)))"],
                               {{}}, log)
            await proc.wait()
            log.close()
        asyncio.run(main())
        print(oct(stat.S_IMODE((state.path / "plan.json").stat().st_mode)))
        print((state.log_dir / "engine.log").read_text().splitlines()[-1])
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, timeout=60).stdout.split()  # fmt: skip
    assert out == ["0o600", "0o22"]  # the plan is private; the engine ran with umask 022


def test_engines_get_only_allow_listed_variables_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t")
    monkeypatch.setenv("CUDA_HOME", "/usr/local/cuda")
    assert "AWS_SECRET_ACCESS_KEY" in engine_environment({})  # the default: inherited
    monkeypatch.setenv("INFERPLANE_ENGINE_ENV_ALLOW", "PATH, CUDA_*")
    env = engine_environment({"VLLM_LOGGING_LEVEL": "INFO"})
    assert "AWS_SECRET_ACCESS_KEY" not in env and env["CUDA_HOME"] == "/usr/local/cuda"
    assert env["VLLM_LOGGING_LEVEL"] == "INFO" and "PATH" in env
    assert not any(k.startswith("INFERPLANE_") for k in env)


def test_up_log_is_rotated_and_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = StateDir(tmp_path / "state")
    state.path.mkdir()
    state.up_log.write_bytes(b"x" * 100)
    os.chmod(state.up_log, 0o644)
    monkeypatch.setattr(control, "UP_LOG_ROTATE_BYTES", 50)
    assert control.log_size(state) == 0  # rotated away
    assert state.up_log.with_name("up.log.1").stat().st_size == 100
    pid = control.spawn_detached([sys.executable, "-c", "print('hi')"], state)
    os.waitpid(pid, 0)
    _until(lambda: state.up_log.read_text() == "hi\n")  # through the writer's pipe
    assert mode(state.up_log) == 0o600


def _until(check: object, timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_up_log_rotates_by_size_while_the_fleet_runs(  # issue 30 item 8
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = StateDir(tmp_path / "state")
    monkeypatch.setattr(control, "UP_LOG_ROTATE_BYTES", 10_000)
    flood = textwrap.dedent("""
        import sys, time
        for i in range(3000):
            print(f"error {i:05d}: accept() out of system resource " + "x" * 20, flush=True)
        print("ü" * 10, file=sys.stderr, flush=True)  # both streams, UTF-8 kept
        time.sleep(60)  # still running while the log is checked
    """)
    pid = control.spawn_detached([sys.executable, "-c", flood], state)
    try:
        _until(lambda: "ü" * 10 in state.up_log.read_text(encoding="utf-8"))
        files = sorted(state.path.glob("up.log*"))
        assert [f.name for f in files] == ["up.log", "up.log.1", "up.log.2", "up.log.3"]
        assert all(f.stat().st_size <= 10_000 and mode(f) == 0o600 for f in files)
        newest = state.up_log.read_text(encoding="utf-8")
        assert "error 02999:" in newest and newest.splitlines()[0].startswith("error ")
        assert "error 00000:" not in "".join(f.read_text() for f in files)  # bounded
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_a_start_failure_is_read_across_a_rotation(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "state")
    state.path.mkdir()
    state.up_log.with_name("up.log.1").write_text("old\nstarting\n")
    state.up_log.write_text("error: port 8000 is taken\n")
    error = control.start_failure(state, offset=len("old\n"))
    assert "port 8000 is taken" in error.message


async def test_a_stopped_engine_is_killed_without_waiting_out_its_grace(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import time; time.sleep(60)", start_new_session=True,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    engine = EngineProcess(proc, RotatingLog(tmp_path / "e.log"))
    os.killpg(proc.pid, signal.SIGSTOP)
    for _ in range(100):
        if stopped(proc.pid):
            break
        await asyncio.sleep(0.02)
    assert stopped(proc.pid)
    t0 = time.monotonic()
    code = await engine.stop(timeout_s=15.0)
    assert code == -signal.SIGKILL
    assert time.monotonic() - t0 < 5  # not the 15 s SIGTERM grace


async def test_an_engine_starts_while_its_log_disk_is_full(tmp_path: Path) -> None:
    """Issue 30 item 11: a killed engine was not restarted while the state disk was full
    (its log's first line raised ENOSPC inside the restart)."""
    from inferplane.runtime.process import spawn

    full = RotatingLog(Path("/dev/full"))  # every write fails with ENOSPC
    proc = await spawn([sys.executable, "-c", "print('up'); import sys; sys.exit(3)"], {}, full)
    assert await proc.wait() == 3  # started, ran, its output dropped
    assert full.dropped >= 1


def test_a_full_state_disk_does_not_stop_the_runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from inferplane.runtime.runner import Runtime

    state = StateDir(tmp_path / "state")
    state.path.mkdir()

    def full(*_: object, **__: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(state, "write", full)

    class Fake:
        state_dir = state
        _targets = None

        def status(self) -> dict[str, str]:
            return {"phase": "running"}

    assert Runtime._write_state(Fake()) is False  # type: ignore[arg-type]  # logs, no raise


def test_state_json_catches_up_once_a_full_disk_has_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by hand from a fresh clone (issue 30 item 11): an engine killed while the
    state disk was full was restarted, but state.json kept naming the dead pid (restarts 0)
    after space was freed, until some later transition."""
    import errno
    from types import SimpleNamespace

    from inferplane.runtime.instances import Instance
    from inferplane.runtime.runner import Runtime
    from inferplane.runtime.supervisor import Supervisor

    state = StateDir(tmp_path / "state")
    state.path.mkdir()
    disk = {"full": True}
    written: list[object] = []

    def write(status: object) -> None:
        if disk["full"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(status)

    monkeypatch.setattr(state, "write", write)

    class Fake:
        state_dir = state
        _targets = None
        _write_state = Runtime._write_state

        def __init__(self) -> None:
            self._asleep: dict[str, object] = {}
            self._parked: set[str] = set()
            self._by_instance = {"chat-0": SimpleNamespace(ready=True)}

        def status(self) -> dict[str, str]:
            return {"phase": "running"}

    fake = Fake()
    supervisor = Supervisor(
        [Instance("chat-0", "chat", "chat", 0, 1, "sim", ())], tmp_path / "logs",
        on_change=lambda rec: Runtime._on_change(fake, rec),  # type: ignore[arg-type]
    )  # fmt: skip
    rec = supervisor.records["chat-0"]
    rec.state = "ready"
    supervisor._notify(rec)  # the restart's transition, on a full disk
    assert written == [] and rec.check_error is not None
    disk["full"] = False
    supervisor._checked(rec)  # the next probe that gets an answer
    assert written == [{"phase": "running"}] and rec.check_error is None
