"""Issue 19.4: supervision survives any exception in a health check and says when it cannot
check; issue 19.8: every model-addressed path drains; issue 18.11: a restart drains first."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
from pathlib import Path

import httpx
import pytest

from inferplane.runtime import Runtime, RuntimeOptions, SupervisorSettings
from inferplane.runtime import supervisor as supervisor_module
from inferplane.runtime.drain import DrainGate
from inferplane.runtime.state import StateDir
from inferplane.spec import load_fleet

FLEET = """\
engine: sim
models:
  - name: chat
    source: Qwen/Qwen3-0.6B
    max_model_len: 4096
"""
SETTINGS = SupervisorSettings(
    probe_interval_s=0.1, probe_timeout_s=0.5, backoff_initial_s=0.05, backoff_max_s=0.2,
    startup_deadline_s=60,
)  # fmt: skip


async def _runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: SupervisorSettings = SETTINGS
) -> Runtime:
    monkeypatch.setattr(StateDir, "running_pid", lambda self: os.getpid())
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    rt = Runtime(
        load_fleet(fleet),
        RuntimeOptions(state_dir=tmp_path / "s", gateway_port=0, settings=settings,
                       tenancy=False, control=False, grace_period_s=30),
    )  # fmt: skip
    await rt.start()
    assert await rt.wait_settled(60)
    return rt


async def _until(condition, timeout_s: float = 10) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def test_supervision_survives_exceptions_in_health_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = await _runtime(tmp_path, monkeypatch)
    try:
        rec = rt.supervisor.records["chat-0"]
        pid = rec.pid
        real_probe = supervisor_module.probe_live
        failing = {"on": True}

        async def broken_probe(*args: object, **kwargs: object) -> str | None:
            if failing["on"]:
                raise OSError(errno.EMFILE, "Too many open files")
            return await real_probe(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(supervisor_module, "probe_live", broken_probe)
        await _until(lambda: rec.supervisor_errors >= 3)
        assert rec.check_error is not None and "Too many open files" in rec.check_error
        status = rt.status()["instances"][0]
        assert status["check_error"] == rec.check_error  # status tells it cannot check
        written = json.loads((tmp_path / "s" / "state.json").read_text())["instances"][0]
        assert "Too many open files" in written["check_error"]  # what `status` reads
        assert rec.state == "ready" and rec.pid == pid  # not an engine failure: no restart
        task = rt.supervisor._tasks["chat-0"]
        assert not task.done()

        # A state callback that raises (the state file cannot be written) is survived too.
        real_change = rt.supervisor._on_change

        def broken_change(r: object) -> None:
            raise OSError(errno.EMFILE, "Too many open files")

        rt.supervisor._on_change = broken_change
        failing["on"] = False  # probes answer again: ready, and the callback raises
        checked = rec.checked_at
        await _until(lambda: rec.checked_at is not None and rec.checked_at != checked)
        rt.supervisor._on_change = real_change
        await _until(lambda: rec.check_error is None)
        await _until(lambda: json.loads((tmp_path / "s" / "state.json").read_text())[
            "instances"][0]["check_error"] is None)  # fmt: skip
        assert not task.done() and rec.state == "ready" and rec.restarts == 0
        async with httpx.AsyncClient(timeout=30) as client:
            r = await client.post(rt.gateway_url + "/v1/chat/completions", json={
                "model": "chat", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}],
            })  # fmt: skip
        assert r.status_code == 200
    finally:
        await rt.drain_and_stop()


async def test_restart_drains_in_flight_requests_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = await _runtime(tmp_path, monkeypatch)
    try:
        rec = rt.supervisor.records["chat-0"]
        pid = rec.pid
        body = {"model": "chat", "max_tokens": 300, "ignore_eos": True, "stream": True,
                "messages": [{"role": "user", "content": "a long answer"}]}  # fmt: skip
        async with httpx.AsyncClient(timeout=60) as client, client.stream(
            "POST", rt.gateway_url + "/v1/chat/completions", json=body
        ) as r:
            assert r.status_code == 200
            chunks = r.aiter_bytes()
            first = await chunks.__anext__()
            rt.supervisor.restart("chat-0")  # while the stream is in flight
            rest = b"".join([c async for c in chunks])
        stream = first + rest
        assert b'"error"' not in stream  # not cut: the restart waited for it
        assert stream.endswith(b"data: [DONE]\n\n")
        await _until(lambda: rec.state == "ready" and rec.pid != pid, 60)
        assert rec.restarts == 1
    finally:
        await rt.drain_and_stop()


async def test_model_paths_outside_v1_drain() -> None:
    seen: list[str] = []

    async def app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        seen.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    gate = DrainGate(app)
    gate.close()
    sent: list[dict[str, object]] = []

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    for path in ("/tokenize", "/detokenize", "/pooling", "/classify", "/score", "/rerank",
                 "/v1/chat/completions", "/v2/rerank"):  # fmt: skip
        sent.clear()
        await gate({"type": "http", "path": path, "method": "POST", "headers": []},
                   receive, send)  # fmt: skip
        assert sent[0]["status"] == 503, path
    assert seen == []
    for path in ("/health", "/metrics"):  # probes still answer while draining
        await gate({"type": "http", "path": path, "method": "GET", "headers": []},
                   receive, send)  # fmt: skip
    assert seen == ["/health", "/metrics"]


async def test_up_sets_tcp_nodelay_so_reused_connections_are_fast(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 19.7: c=1 through `up` on one keep-alive connection. With Nagle's algorithm on,
    each small answer waited for a delayed ACK (~40-44 ms); without, well under 1 ms."""
    import socket
    import statistics
    import time

    rt = await _runtime(tmp_path, monkeypatch)
    try:
        transport = httpx.AsyncHTTPTransport(
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
        )
        async with httpx.AsyncClient(transport=transport, timeout=10) as client:
            await client.get(rt.gateway_url + "/health")
            for proto in list(rt.gateway.connections.live):  # every accepted socket
                sock = proto.transport.get_extra_info("socket")
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
            took = []
            for _ in range(30):
                t0 = time.perf_counter()
                r = await client.get(rt.gateway_url + "/v1/models")
                took.append(time.perf_counter() - t0)
                assert r.status_code == 200
        assert statistics.median(took) < 0.025  # generous; Nagle's delayed ACK is ~0.04 s
    finally:
        await rt.drain_and_stop()


async def test_streams_on_a_stopped_engine_end_when_the_supervisor_restarts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 19.5 under `up`: SIGSTOP an engine mid-stream. Its stream ends with the SSE
    error event once the supervisor decides to restart it, not after the kill (a stopped
    process ignores SIGTERM for `stop_timeout_s`) nor after the gateway's idle timeout."""
    import dataclasses
    import signal

    settings = dataclasses.replace(SETTINGS, stop_timeout_s=60)
    rt = await _runtime(tmp_path, monkeypatch, settings)
    rec = rt.supervisor.records["chat-0"]
    pid = rec.pid
    assert pid is not None
    try:
        body = {"model": "chat", "max_tokens": 2000, "ignore_eos": True, "stream": True,
                "messages": [{"role": "user", "content": "a long answer"}]}  # fmt: skip
        async with httpx.AsyncClient(timeout=30) as client, client.stream(
            "POST", rt.gateway_url + "/v1/chat/completions", json=body
        ) as r:
            chunks = r.aiter_bytes()
            first = await chunks.__anext__()
            os.kill(pid, signal.SIGSTOP)  # the engine hangs mid-stream
            rest = b"".join([c async for c in chunks])  # the 30 s client timeout would fail
        events = [e for e in (first + rest).split(b"\n\n") if e]
        assert b'"error"' in events[-2] and b"restarting" in events[-2]
        assert events[-1] == b"data: [DONE]"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)  # lets SIGTERM through, so stopping is quick
        await rt.drain_and_stop()


async def test_drain_does_not_wait_for_a_slow_body_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 19.3: a client trickling its body held `up`'s drain for the whole grace period
    (30 s here); now it gets 503 at once and the drain takes what the real stream needs."""
    rt = await _runtime(tmp_path, monkeypatch)
    host, port = rt.gateway_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
                 b"Content-Length: 100\r\n\r\n{\"model\": ")  # fmt: skip
    await writer.drain()
    body = {"model": "chat", "max_tokens": 40, "ignore_eos": True, "stream": True,
            "messages": [{"role": "user", "content": "x"}]}  # fmt: skip
    loop = asyncio.get_running_loop()
    async with httpx.AsyncClient(timeout=30) as client, client.stream(
        "POST", rt.gateway_url + "/v1/chat/completions", json=body
    ) as r:
        chunks = r.aiter_bytes()
        first = await chunks.__anext__()
        t0 = loop.time()
        drained = asyncio.ensure_future(rt.drain_and_stop())
        slow = await asyncio.wait_for(reader.read(), 10)
        rest = b"".join([c async for c in chunks])
    assert await asyncio.wait_for(drained, 25)  # every request finished within the grace
    took = loop.time() - t0
    assert slow.startswith(b"HTTP/1.1 503 ")
    assert (first + rest).endswith(b"data: [DONE]\n\n")  # the real stream ran to its end
    assert took < 15  # far below the 30 s grace period the slow client used to hold
    writer.close()


async def test_supervision_survives_a_failing_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception outside any probe (spawn out of descriptors during a restart) is
    survived too: supervision retries with backoff and the instance comes back."""
    rt = await _runtime(tmp_path, monkeypatch)
    try:
        rec = rt.supervisor.records["chat-0"]
        pid = rec.pid
        real_spawn = supervisor_module.spawn
        calls = {"n": 0}

        async def flaky_spawn(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
            calls["n"] += 1
            if calls["n"] == 1:
                raise OSError(errno.EMFILE, "Too many open files")
            return await real_spawn(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(supervisor_module, "spawn", flaky_spawn)
        rt.supervisor.restart("chat-0")
        await _until(lambda: rec.state == "ready" and rec.pid not in (None, pid), 60)
        assert calls["n"] == 2 and rec.supervisor_errors >= 1
        assert not rt.supervisor._tasks["chat-0"].done()
    finally:
        await rt.drain_and_stop()


async def test_a_stopped_engine_is_restarted_at_its_first_failed_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 30 item 14: a SIGSTOPped engine's streams waited for the restart decision
    (`failure_threshold` failed checks, +23.5 s) and then for its SIGTERM grace, though it
    was known unhealthy at the first check. A stopped process is restarted at once and
    killed without a grace it cannot use."""
    import dataclasses
    import signal

    settings = dataclasses.replace(SETTINGS, probe_timeout_s=1.0, failure_threshold=20,
                                   stop_timeout_s=60)  # fmt: skip
    rt = await _runtime(tmp_path, monkeypatch, settings)
    rec = rt.supervisor.records["chat-0"]
    pid = rec.pid
    assert pid is not None
    loop = asyncio.get_running_loop()
    try:
        body = {"model": "chat", "max_tokens": 2000, "ignore_eos": True, "stream": True,
                "messages": [{"role": "user", "content": "a long answer"}]}  # fmt: skip
        async with httpx.AsyncClient(timeout=30) as client, client.stream(
            "POST", rt.gateway_url + "/v1/chat/completions", json=body
        ) as r:
            chunks = r.aiter_bytes()
            await chunks.__anext__()
            os.kill(pid, signal.SIGSTOP)
            t0 = loop.time()
            rest = b"".join([c async for c in chunks])
            took = loop.time() - t0
        assert b"stopped (SIGSTOP)" in rest
        # One failed check (<= interval + timeout), not 20 of them nor the 60 s grace.
        assert took < 10
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        await rt.drain_and_stop()
