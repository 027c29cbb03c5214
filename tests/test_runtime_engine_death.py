"""The supervisor knows real vLLM's ways (issue 23 item 3): an engine that turns /health 503
and then exits with code 0 has died (restarted and counted, not a clean stop), and an engine
is ready only after /health 200 and a first successful /v1/models."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

from inferplane.runtime.instances import Instance, free_port
from inferplane.runtime.supervisor import Supervisor, SupervisorSettings, exit_reason

SCRIPT = Path(__file__).with_name("dying_engine.py")
SETTINGS = SupervisorSettings(
    probe_interval_s=0.1, probe_timeout_s=1.0, startup_deadline_s=20, failure_threshold=50,
    backoff_initial_s=0.05, backoff_max_s=0.1, stop_timeout_s=2,
)


def _instance(tmp_path: Path, die_after_s: float, models_after_s: float) -> Instance:
    port = free_port()
    argv = (sys.executable, str(SCRIPT), str(port), "m-served", str(tmp_path / "starts"),
            str(die_after_s), str(models_after_s))
    return Instance(name="m-0", model="m", served_name="m-served", replica=0, port=port,
                    engine="vllm", argv=argv)


async def _until(predicate: object, timeout_s: float = 20) -> None:
    async def poll() -> None:
        while not predicate():  # type: ignore[operator]
            await asyncio.sleep(0.05)

    await asyncio.wait_for(poll(), timeout_s)


async def test_exit_code_0_after_health_503_is_a_crash_restarted_and_counted(
    tmp_path: Path,
) -> None:
    sup = Supervisor([_instance(tmp_path, die_after_s=1.0, models_after_s=0)], tmp_path / "l",
                     SETTINGS)
    sup.start()
    try:
        rec = sup.records["m-0"]
        await _until(lambda: rec.state == "ready")
        # it dies (503, then exit 0) and is started again: a crash, not a stop
        await _until(lambda: rec.restarts == 1 and rec.state == "ready")
        assert (tmp_path / "starts").read_text().count("start") == 2
        events = sup.log_path("m-0").read_text()
        assert "restarting: exited with code 0 after /health answered 503" in events
        assert "the engine died" in events
    finally:
        await sup.stop()


async def test_ready_only_after_a_first_successful_v1_models(tmp_path: Path) -> None:
    sup = Supervisor([_instance(tmp_path, die_after_s=3600, models_after_s=1.5)],
                     tmp_path / "l", SETTINGS)
    started = time.monotonic()
    sup.start()
    try:
        rec = sup.records["m-0"]
        await _until(lambda: rec.state == "ready")
        # /health said 200 from the start; readiness waited for /v1/models
        assert time.monotonic() - started >= 1.5
        assert rec.restarts == 0
    finally:
        await sup.stop()


def test_exit_reasons_name_engine_death_for_code_0() -> None:
    assert "the engine died" in exit_reason(0, "/health answered 503")
    assert "after /health answered 503" in exit_reason(0, "/health answered 503")
    assert "the engine died" in exit_reason(0, None)
    assert exit_reason(1, None) == "exited with code 1"
    assert exit_reason(-9, "x") == "exited with code -9"


FORKING = Path(__file__).with_name("forking_engine.py")


def _alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except OSError:
        return False


async def test_kill_9_of_the_server_restarts_at_once_though_its_children_hold_the_log(
    tmp_path: Path,
) -> None:
    # Real vLLM's EngineCore and worker outlive a kill -9 of the API server and keep its
    # stdout open; the supervisor must see the exit itself, not wait for the pipe or for
    # failed health checks (here 1000 of them, one every 0.5 s: far beyond the wait).
    state = tmp_path / "starts"
    port = free_port()
    inst = Instance(name="m-0", model="m", served_name="m-served", replica=0, port=port,
                    engine="vllm", argv=(sys.executable, str(FORKING), str(port), "m-served",
                                         str(state)))
    settings = SupervisorSettings(
        probe_interval_s=0.5, probe_timeout_s=1.0, startup_deadline_s=20,
        failure_threshold=1000, backoff_initial_s=0.05, backoff_max_s=0.1, stop_timeout_s=2,
    )
    sup = Supervisor([inst], tmp_path / "l", settings)
    sup.start()
    try:
        rec = sup.records["m-0"]
        await _until(lambda: rec.state == "ready")
        _, server, child = state.read_text().split()
        await _until(lambda: "engine core up" in sup.log_path("m-0").read_text())
        os.kill(int(server), signal.SIGKILL)
        await _until(lambda: rec.restarts == 1 and rec.state == "ready", timeout_s=15)
        events = sup.log_path("m-0").read_text()
        assert "restarting: exited with code -9" in events
        assert "consecutive failed health checks" not in events
        assert not _alive(int(child))  # the rest of its process group was killed
        assert state.read_text().count("start") == 2
    finally:
        await sup.stop()
    _, _, second_child = state.read_text().splitlines()[1].split()
    # stop() leaves no child either: it was sent SIGKILL, which a loaded box may take a
    # moment to act on (a child that ignored it would still be alive after the wait)
    await _until(lambda: not _alive(int(second_child)), timeout_s=5)
