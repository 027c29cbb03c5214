"""`inferplane up` for real: simulated engine processes on 127.0.0.1, the gateway in front."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import openai
import psutil
import pytest
from sim_runtime import FAST

from inferplane.errors import InferplaneError
from inferplane.runtime import Runtime, RuntimeOptions, SupervisorSettings
from inferplane.sim.config import FaultConfig
from inferplane.spec import load_fleet

FLEET = """\
engine: sim
models:
  - name: chat
    source: Qwen/Qwen3-0.6B
    max_model_len: 4096
  - name: remote
    endpoints: ["http://127.0.0.1:9"]
"""


def _fleet_file(tmp_path: Path, text: str = FLEET) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return path


@pytest.fixture
async def runtime(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Runtime]:
    faults = getattr(request, "param", None)
    rt = Runtime(
        load_fleet(_fleet_file(tmp_path)),
        RuntimeOptions(state_dir=tmp_path / "state", gateway_port=0, settings=FAST,
                       faults=faults, grace_period_s=10),
    )
    await rt.start()
    assert await rt.wait_settled(30)
    yield rt
    await rt.drain_and_stop()


async def _chat(url: str, max_tokens: int = 4) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.post(url + "/v1/chat/completions", json={
            "model": "chat", "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "hello"}],
        })


async def _until(predicate: object, timeout_s: float = 20) -> None:
    async def poll() -> None:
        while not predicate():  # type: ignore[operator]
            await asyncio.sleep(0.05)

    await asyncio.wait_for(poll(), timeout_s)


async def test_up_serves_through_the_gateway_with_the_openai_client(runtime: Runtime) -> None:
    def ask() -> str:
        client = openai.OpenAI(base_url=runtime.gateway_url + "/v1", api_key="x")
        reply = client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=5
        )
        return reply.choices[0].message.content or ""

    assert await asyncio.to_thread(ask)
    state = json.loads((runtime.state_dir.state_file).read_text())
    assert state["phase"] == "running" and state["gateway"]["url"] == runtime.gateway_url
    [inst] = state["instances"]
    assert inst["name"] == "chat-0" and inst["state"] == "ready" and inst["restarts"] == 0
    assert psutil.pid_exists(inst["pid"])
    assert state["endpoint_models"] == [{"model": "remote", "endpoints": ["http://127.0.0.1:9"]}]
    assert (runtime.state_dir.log_dir / "chat-0.log").read_text().startswith("--- starting")


async def test_kill_9_engine_is_restarted_and_never_routed_to_meanwhile(runtime: Runtime) -> None:
    rec = runtime.supervisor.records["chat-0"]
    backend = runtime.backends["chat"][0]
    old_pid = rec.pid
    assert old_pid is not None and backend.ready
    os.kill(old_pid, signal.SIGKILL)
    await _until(lambda: rec.state != "ready")
    assert not backend.ready
    # No ready replica: the gateway answers 503 itself instead of trying the dead engine.
    resp = await _chat(runtime.gateway_url)
    assert resp.status_code == 503 and "no ready replica" in resp.text
    await _until(lambda: rec.state == "ready")
    assert rec.restarts == 1 and rec.pid != old_pid and backend.ready
    assert (await _chat(runtime.gateway_url)).status_code == 200


@pytest.mark.parametrize("runtime", [{"chat-0": FaultConfig(hang_after_requests=1)}],
                         indirect=True)
async def test_hung_engine_is_detected_and_restarted(runtime: Runtime) -> None:
    rec = runtime.supervisor.records["chat-0"]
    old_pid = rec.pid
    assert (await _chat(runtime.gateway_url)).status_code == 200  # the engine now hangs
    await _until(lambda: rec.restarts == 1 and rec.state == "ready")
    assert rec.pid != old_pid and not psutil.pid_exists(old_pid or -1)
    assert "hung" in (rec.last_error or "") or "did not answer" in (rec.last_error or "")
    assert (await _chat(runtime.gateway_url)).status_code == 200


async def test_crash_loop_gives_up_and_marks_failed(tmp_path: Path) -> None:
    fleet = load_fleet(_fleet_file(tmp_path, FLEET.replace("Qwen/Qwen3-0.6B", "Qwen/Qwen3-8B")
                                   .replace("max_model_len: 4096", "max_model_len: 99999999")))
    settings = SupervisorSettings(
        probe_interval_s=0.1, probe_timeout_s=0.5, startup_deadline_s=20,
        backoff_initial_s=0.05, backoff_max_s=0.1, crash_loop_limit=1, stop_timeout_s=2,
    )
    rt = Runtime(fleet, RuntimeOptions(state_dir=tmp_path / "s", gateway_port=0,
                                       settings=settings))
    await rt.start()
    try:
        assert await rt.wait_settled(30) is False
        rec = rt.supervisor.records["chat-0"]
        assert rec.state == "failed" and rec.restarts == 1
        assert "crash loop" in (rec.last_error or "")
    finally:
        await rt.drain_and_stop()


def test_vllm_fleet_without_gpus_is_refused_clearly(tmp_path: Path) -> None:
    from inferplane.gpus.fake_nvml import FakeNvml

    fleet = load_fleet(_fleet_file(tmp_path, FLEET.replace("engine: sim", "engine: vllm")))
    with pytest.raises(InferplaneError, match="no GPUs were found"):
        Runtime(fleet, RuntimeOptions(state_dir=tmp_path / "s", nvml=FakeNvml([])))
    assert not (tmp_path / "s" / "up.pid").exists()


async def test_sigterm_drains_20_streams_then_everything_exits(tmp_path: Path) -> None:
    fleet = _fleet_file(tmp_path, FLEET.replace("max_model_len: 4096",
                                                "max_model_len: 4096\n    replicas: 2"))
    state_dir = tmp_path / "state"
    up = subprocess.Popen(
        [sys.executable, "-m", "inferplane", "up", str(fleet), "--state-dir", str(state_dir),
         "--gateway-port", "0", "--grace-period-s", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        await _until(lambda: (state_dir / "state.json").exists()
                     and json.loads((state_dir / "state.json").read_text())["phase"] == "running",
                     30)
        state = json.loads((state_dir / "state.json").read_text())
        url = state["gateway"]["url"]
        engines = [psutil.Process(i["pid"]) for i in state["instances"]]
        assert len(engines) == 2
        started = asyncio.Event()
        first_chunks = 0

        async def stream(client: httpx.AsyncClient) -> str:
            nonlocal first_chunks
            body = {"model": "chat", "stream": True, "max_tokens": 2000, "ignore_eos": True,
                    "messages": [{"role": "user", "content": "tell a story"}]}
            text = ""
            async with client.stream("POST", url + "/v1/chat/completions", json=body) as resp:
                assert resp.status_code == 200
                async for chunk in resp.aiter_text():
                    if not text:
                        first_chunks += 1
                        if first_chunks == 20:
                            started.set()
                    text += chunk
            return text

        async with httpx.AsyncClient(timeout=60) as client:
            tasks = [asyncio.ensure_future(stream(client)) for _ in range(20)]
            await asyncio.wait_for(started.wait(), 30)
            up.send_signal(signal.SIGTERM)
            await _until(lambda: json.loads((state_dir / "state.json").read_text())["phase"]
                         == "draining", 10)
            refused = await client.post(url + "/v1/chat/completions", json={
                "model": "chat", "messages": [{"role": "user", "content": "x"}]})
            assert refused.status_code == 503
            results = await asyncio.gather(*tasks)
        assert all(r.rstrip().endswith("data: [DONE]") for r in results)
        assert await asyncio.to_thread(up.wait, 30) == 0
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in engines)
        assert not (state_dir / "up.pid").exists()
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
