"""The supervisor knows real vLLM's ways (issue 23 item 3): an engine that turns /health 503
and then exits with code 0 has died (restarted and counted, not a clean stop), and an engine
is ready only after /health 200 and a first successful /v1/models."""

from __future__ import annotations

import asyncio
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
