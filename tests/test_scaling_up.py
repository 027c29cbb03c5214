"""The local autoscaler in `up`, for real: simulated engine processes on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from rich.console import Console
from sim_runtime import CHAT_FLEET, start_runtime

from inferplane.cli.up import print_status
from inferplane.runtime import Runtime
from inferplane.scaling.events import read_events
from inferplane.sim.config import FaultConfig

ELASTIC = CHAT_FLEET + """\
    replicas: {replicas}
    routing: {{max_queue_depth: {depth}, max_queue_wait_s: {wait}}}
scaling:
  policy: {{target_waiting_requests: 1, scale_up_window_s: 0.3, scale_down_window_s: 0.8,
           stabilization_s: 0.5}}
  models:
    chat: {{min_replicas: {min}, max_replicas: 2}}
"""


async def _runtime(tmp_path: Path, *, replicas: int = 1, min_r: int = 1, depth: int = 64,
                   wait: float = 30, faults: dict[str, FaultConfig] | None = None) -> Runtime:
    fleet = ELASTIC.format(replicas=replicas, min=min_r, depth=depth, wait=wait)
    return await start_runtime(tmp_path, fleet, faults)


@pytest.fixture
async def elastic(tmp_path: Path) -> AsyncIterator[Runtime]:
    rt = await _runtime(tmp_path)
    yield rt
    await rt.drain_and_stop()


def _body(max_tokens: int, stream: bool = False) -> dict[str, object]:
    return {"model": "chat", "max_tokens": max_tokens, "ignore_eos": True, "stream": stream,
            "messages": [{"role": "user", "content": "hello"}]}


async def _until(predicate: object, timeout_s: float = 20) -> None:
    async def poll() -> None:
        while not predicate():  # type: ignore[operator]
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), timeout_s)


async def test_a_queue_above_target_adds_a_replica_that_gets_traffic_then_idle_drains_it(
    elastic: Runtime,
) -> None:
    rt = elastic
    statuses: list[int] = []
    stop = asyncio.Event()

    async def user(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            r = await client.post(rt.gateway_url + "/v1/chat/completions", json=_body(400))
            statuses.append(r.status_code)

    async with httpx.AsyncClient(timeout=30) as client:
        users = [asyncio.create_task(user(client)) for _ in range(8)]
        await _until(lambda: len(rt.backends["chat"]) == 2)
        new = rt.backends["chat"][1]
        await _until(lambda: new.ready and new.outstanding > 0)  # the gateway routes to it
        stop.set()
        await asyncio.gather(*users)
        # one user keeps asking while the idle window passes: the victim drains first
        stop.clear()
        trickle = asyncio.create_task(user(client))
        await _until(lambda: len(rt.awake_replicas("chat")) == 1, 30)
        stop.set()
        await trickle
    assert statuses and set(statuses) == {200}, statuses
    kinds = [e["kind"] for e in read_events(rt.state_dir.path)]
    assert kinds[:2] == ["scale_up", "scale_down"], kinds
    up, down = read_events(rt.state_dir.path)[:2]
    assert "waiting per replica" in up["reason"] and up["replicas_after"] == 2
    assert "idle for" in down["reason"] and "drained and stopped" in down["reason"]
    status = json.loads(rt.state_dir.state_file.read_text())
    assert status["scaling"]["models"]["chat"]["current"] == 1
    assert status["scaling"]["events"][-1]["kind"] == "scale_down"
    shown = Console(record=True, width=300)
    print_status(status, shown)
    assert "scaling chat: 1 awake, desired 1 [1..2]; last scale_down: idle for" in (
        shown.export_text())
    metrics = rt.gateway.metrics.render().decode()
    assert 'inferplane_autoscaler_desired_replicas{model="chat"} 1.0' in metrics
    assert 'inferplane_autoscaler_decisions_total{action="scale_up",model="chat"} 1.0' in metrics
    assert "inferplane_autoscaler_last_decision_timestamp_seconds" in metrics


async def test_a_model_at_zero_answers_its_first_requests_after_a_held_wait(
    tmp_path: Path,
) -> None:
    rt = await _runtime(tmp_path, replicas=0, min_r=0)
    try:
        assert rt.awake_replicas("chat") == []
        async with httpx.AsyncClient(timeout=30) as client:
            # at zero on purpose the gateway is ready: it wakes the model on request, so a
            # readiness probe must not take it out of the Service
            ready = await client.get(rt.gateway_url + "/ready")
            assert ready.status_code == 200, ready.text
            assert ready.json() == {"status": "ready", "models_waking_on_request": ["chat"]}
            assert rt.awake_replicas("chat") == []  # asking /ready wakes nothing
            r = await client.post(rt.gateway_url + "/v1/chat/completions", json=_body(3))
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"]
            await _until(lambda: rt.awake_replicas("chat") == [], 30)  # idle: back to zero
            async with client.stream("POST", rt.gateway_url + "/v1/chat/completions",
                                     json=_body(3, stream=True)) as resp:
                assert resp.status_code == 200
                text = "".join([chunk async for chunk in resp.aiter_text()])
        assert text.rstrip().endswith("data: [DONE]") and '"delta"' in text
        metrics = rt.gateway.metrics.render().decode()
        assert 'inferplane_model_cold_starts_total{kind="start",model="chat"} 2.0' in metrics
        assert 'inferplane_model_hold_seconds_count{model="chat"} 2.0' in metrics
        assert "scale from zero" in read_events(rt.state_dir.path)[0]["reason"]
    finally:
        await rt.drain_and_stop()


async def test_held_requests_are_bounded_by_queue_depth_and_wait(tmp_path: Path) -> None:
    # the engine takes 10 s to load; the queue holds 1 request for at most 2.5 s (long
    # enough for the second request to arrive while the first is held, on a loaded box)
    rt = await _runtime(tmp_path, replicas=0, min_r=0, depth=1, wait=2.5,
                        faults={"chat": FaultConfig(load_time_s=10)})
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            url = rt.gateway_url + "/v1/chat/completions"
            first = asyncio.create_task(client.post(url, json=_body(3)))
            await _until(lambda: len(rt.gateway.state.pools["chat"].queue) == 1)
            second = await client.post(url, json=_body(3))
            late = await first
        assert second.status_code == 429 and second.headers["retry-after"]
        assert late.status_code == 503 and late.headers["retry-after"]
        # the wait was for the engine to start, not for a busy replica's slot
        assert late.json()["error"]["message"] == (
            "model `chat` did not wake within 2.5 s (no replica finished waking or starting); "
            "retry later")
    finally:
        await rt.drain_and_stop()


async def test_a_sleeping_engine_that_dies_comes_back_awake_and_routed(tmp_path: Path) -> None:
    fleet = ELASTIC.format(replicas=1, min=0, depth=64, wait=30).replace(
        "chat: {min_replicas: 0, max_replicas: 2}",
        "chat: {min_replicas: 0, max_replicas: 2, sleep: {level: 1}}",
    ).replace("scale_down_window_s: 0.8", "scale_down_window_s: 60")
    rt = await start_runtime(tmp_path, fleet)
    try:
        assert await rt.sleep_replica("chat-0", 1) == 1
        rec = rt.supervisor.records["chat-0"]
        assert rt.asleep_replicas("chat") == ["chat-0"] and not rt.backends["chat"][0].ready
        status = json.loads(rt.state_dir.state_file.read_text())
        assert status["instances"][0]["sleep_level"] == 1
        assert rec.pid is not None
        os.kill(rec.pid, signal.SIGKILL)
        await _until(lambda: rec.restarts == 1 and rec.state == "ready", 30)
        assert rt.asleep_replicas("chat") == [] and rt.backends["chat"][0].ready
        async with httpx.AsyncClient(timeout=30) as client:
            r = await client.post(rt.gateway_url + "/v1/chat/completions", json=_body(3))
        assert r.status_code == 200
    finally:
        await rt.drain_and_stop()
