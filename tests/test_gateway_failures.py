"""Failure handling: retries before the first byte only, mid-stream death, passive health,
timeouts, client disconnects and admission backpressure."""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from test_gateway_fakes import FakeEngine, Harness, async_http_client, harness, http  # noqa: F401

from inferplane.gateway import Admission, Backend, GatewayConfig, ModelRoute, Timeouts
from inferplane.gateway.app import GatewayApp

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
STREAM = {**CHAT, "stream": True}


_HELD_PORTS: list[socket.socket] = []


def dead_url() -> str:
    """A port nobody listens on: bound and kept (not listening), so connecting is refused
    and no other server of the test run can take the port meanwhile."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    _HELD_PORTS.append(sock)
    return f"http://127.0.0.1:{sock.getsockname()[1]}"


def gateway(harness: Harness, urls: list[str], **route: object) -> tuple[GatewayApp, str]:  # noqa: F811
    config = GatewayConfig(
        models=(ModelRoute("m", endpoints=tuple(urls), **route),),  # type: ignore[arg-type]
        access_log=False,
        health_interval_s=0.05,
    )
    return harness.gateway(config)


def wait_until(condition, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.01)


def metric(url: str, prefix: str) -> float:
    total = 0.0
    for line in http.get(url + "/metrics").text.splitlines():
        if line.startswith(prefix):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_5xx_before_the_first_byte_is_retried_on_another_replica(harness: Harness) -> None:  # noqa: F811
    failing, healthy = harness.engine("m"), harness.engine("m")
    failing.fail_statuses = [503] * 100
    _, url = gateway(harness, [failing.url, healthy.url], eject_after_failures=100)
    for _ in range(4):
        assert http.post(url + "/v1/chat/completions", json=CHAT).status_code == 200
    assert len(failing.requests) >= 1  # ties rotate, so the failing replica was tried first
    assert metric(url, "inferplane_upstream_retries_total") == len(failing.requests)
    assert len(healthy.requests) == 4


def test_connect_error_is_retried_and_the_dead_replica_ejected(harness: Harness) -> None:  # noqa: F811
    live = harness.engine("m")
    app, url = gateway(harness, [dead_url(), live.url], eject_after_failures=2)
    for _ in range(6):
        assert http.post(url + "/v1/chat/completions", json=CHAT).status_code == 200
    dead = next(b for b in app.state.backends("m") if b.url != live.url)
    assert dead.ejected
    assert metric(url, "inferplane_replica_ejections_total") == 1


def test_ejected_replica_is_readmitted_when_healthy(harness: Harness) -> None:  # noqa: F811
    engine, other = harness.engine("m"), harness.engine("m")
    app, url = gateway(harness, [engine.url, other.url], eject_after_5xx=1)
    engine.fail_statuses = [500] * 10
    engine.health_status = 503
    backend = next(b for b in app.state.backends("m") if b.url == engine.url)
    for _ in range(3):  # a 500 that the other replica does not share is the replica's
        assert http.post(url + "/v1/chat/completions", json=CHAT).status_code == 200
    assert backend.ejected
    served = len(engine.requests)
    for _ in range(3):
        assert http.post(url + "/v1/chat/completions", json=CHAT).status_code == 200
    assert len(engine.requests) == served  # out of rotation
    engine.fail_statuses.clear()
    engine.health_status = 200
    wait_until(lambda: not backend.ejected)
    assert http.post(url + "/v1/chat/completions", json=CHAT).status_code == 200


def test_all_replicas_failing_returns_502_in_openai_shape(harness: Harness) -> None:  # noqa: F811
    _, url = gateway(harness, [dead_url(), dead_url()])
    r = http.post(url + "/v1/chat/completions", json=CHAT)
    assert r.status_code == 502 and r.json()["error"]["code"] == 502


def test_mid_stream_death_ends_with_an_error_event_and_is_not_retried(harness: Harness) -> None:  # noqa: F811
    a, b = harness.engine("m"), harness.engine("m")
    a.die_after_chunks = b.die_after_chunks = 2
    _, url = gateway(harness, [a.url, b.url])
    with http.stream("POST", url + "/v1/chat/completions", json=STREAM, timeout=10) as r:
        assert r.status_code == 200
        body = r.read()
    events = [e for e in body.split(b"\n\n") if e]
    assert b"tok0" in events[0] and b"tok1" in events[1]
    assert b'"error"' in events[-2] and events[-1] == b"data: [DONE]"
    assert len(a.requests) + len(b.requests) == 1  # no retry after the first byte


def test_first_token_timeout_is_504_and_cancels_upstream(harness: Harness) -> None:  # noqa: F811
    engine = harness.engine("m")
    engine.hang = True
    timeouts = Timeouts(first_token_s=0.2, idle_s=5, total_s=30)
    _, url = gateway(harness, [engine.url], timeouts=timeouts)
    r = http.post(url + "/v1/chat/completions", json=STREAM, timeout=10)
    assert r.status_code == 504 and "timed out" in r.json()["error"]["message"]
    wait_until(lambda: engine.cancelled == 1)


def test_idle_gap_mid_stream_ends_the_stream_with_an_error_event(harness: Harness) -> None:  # noqa: F811
    engine = harness.engine("m")
    engine.stall_after_chunks = 2
    timeouts = Timeouts(first_token_s=5, idle_s=0.2, total_s=30)
    _, url = gateway(harness, [engine.url], timeouts=timeouts)
    with http.stream("POST", url + "/v1/chat/completions", json=STREAM, timeout=10) as r:
        assert r.status_code == 200
        body = r.read()
    events = [e for e in body.split(b"\n\n") if e]
    assert b"tok1" in events[1]
    assert b'"code":504' in events[-2] and events[-1] == b"data: [DONE]"
    wait_until(lambda: engine.cancelled == 1)  # the wedged upstream request was dropped
    assert 'status="504"' in http.get(url + "/metrics").text


def test_non_streaming_is_bounded_by_total_not_first_token(harness: Harness) -> None:  # noqa: F811
    engine = harness.engine("m")
    engine.delay_s = 0.3  # a "long generation": longer than first_token_s
    timeouts = Timeouts(first_token_s=0.1, idle_s=0.1, total_s=30)
    _, url = gateway(harness, [engine.url], timeouts=timeouts)
    assert http.post(url + "/v1/chat/completions", json=CHAT, timeout=10).status_code == 200
    engine.hang = True
    _, url = gateway(harness, [engine.url], timeouts=Timeouts(total_s=0.2))
    assert http.post(url + "/v1/chat/completions", json=CHAT, timeout=10).status_code == 504


def test_client_disconnect_cancels_the_upstream_request(harness: Harness) -> None:  # noqa: F811
    engine = harness.engine("m")
    engine.hang = True
    app, url = gateway(harness, [engine.url])
    with pytest.raises(httpx.ReadTimeout):
        http.post(url + "/v1/chat/completions", json=CHAT, timeout=0.3)
    wait_until(lambda: engine.cancelled == 1)
    (backend,) = app.state.backends("m")
    wait_until(lambda: backend.outstanding == 0)
    wait_until(lambda: metric(url, 'inferplane_requests_total{model="m"') >= 1)
    assert 'status="499"' in http.get(url + "/metrics").text


def test_full_queue_is_429_and_queue_timeout_is_503_with_retry_after(harness: Harness) -> None:  # noqa: F811
    engine = harness.engine("m")
    engine.hang = True
    admission = Admission(max_queue_depth=1, max_queue_wait_s=0.5, retry_after_s=3)
    app, url = gateway(harness, [engine.url], max_concurrency_per_replica=1, admission=admission)

    async def scenario() -> list[httpx.Response]:
        import asyncio

        async with async_http_client() as client:
            holder = asyncio.create_task(client.post(url + "/v1/chat/completions", json=CHAT))
            await asyncio.sleep(0.1)  # the only slot is taken
            queued = asyncio.create_task(client.post(url + "/v1/chat/completions", json=CHAT))
            await asyncio.sleep(0.1)
            rejected = await client.post(url + "/v1/chat/completions", json=CHAT)
            timed_out = await queued
            holder.cancel()
            return [rejected, timed_out]

    rejected, timed_out = harness.run(scenario())
    assert rejected.status_code == 429 and rejected.headers["retry-after"] == "3"
    assert rejected.json()["error"]["type"] == "RateLimitError"
    assert timed_out.status_code == 503 and timed_out.headers["retry-after"] == "3"
    (backend,) = app.state.backends("m")
    wait_until(lambda: backend.outstanding == 0)


def test_queued_request_is_served_when_a_slot_frees(harness: Harness) -> None:  # noqa: F811
    engine = harness.engine("m")
    engine.delay_s = 0.2
    _app, url = gateway(harness, [engine.url], max_concurrency_per_replica=1)

    async def scenario() -> list[int]:
        import asyncio

        async with async_http_client() as client:
            rs = await asyncio.gather(
                *(client.post(url + "/v1/chat/completions", json=CHAT) for _ in range(3))
            )
        return [r.status_code for r in rs]

    assert harness.run(scenario()) == [200, 200, 200]
    assert metric(url, 'inferplane_queue_wait_seconds_count{model="m"}') == 3


def test_engine_metrics_policy_routes_away_from_a_busy_replica(harness: Harness) -> None:  # noqa: F811
    busy, idle = harness.engine("m"), harness.engine("m")
    busy.metrics_text = (
        "vllm:num_requests_running 9\nvllm:num_requests_waiting 30\nvllm:kv_cache_usage_perc 0.9\n"
    )
    idle.metrics_text = (
        "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.1\n"
    )
    config = GatewayConfig(
        models=(
            ModelRoute(
                "m", endpoints=(busy.url, idle.url), scorers=("engine_metrics", "least_outstanding")
            ),
        ),
        access_log=False,
        engine_metrics_interval_s=0.05,
    )
    app, url = harness.gateway(config)
    wait_until(lambda: all(b.engine is not None for b in app.state.backends("m")))
    for _ in range(5):
        http.post(url + "/v1/chat/completions", json=CHAT)
    assert len(idle.requests) == 5 and busy.requests == []
    busy.metrics_text = None  # metrics vanish: the replica is saturated, never idle
    idle.metrics_text = idle.metrics_text.replace("waiting 0", "waiting 50")
    wait_until(lambda: app.state.backends("m")[0].engine is None)
    http.post(url + "/v1/chat/completions", json=CHAT)
    assert busy.requests == [] and len(idle.requests) == 6
    assert metric(url, "inferplane_engine_metrics_unusable_total") >= 1


def test_access_log_has_metadata_and_no_prompt_text(harness: Harness, tmp_path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    engine = harness.engine("m")
    log = tmp_path / "access.log"
    config = GatewayConfig(
        models=(ModelRoute("m", endpoints=(engine.url,)),), access_log_path=str(log)
    )
    _, url = harness.gateway(config)
    secret = {"model": "m", "messages": [{"role": "user", "content": "my secret prompt"}]}
    r = http.post(url + "/v1/chat/completions", json=secret, headers={"x-request-id": "abc"})
    assert r.status_code == 200
    wait_until(lambda: log.exists() and b"abc" in log.read_bytes())
    import orjson

    line = orjson.loads(log.read_bytes().splitlines()[0])
    assert line["request_id"] == "abc" and line["status"] == 200 and line["model"] == "m"
    assert line["prompt_tokens"] == 7 and line["completion_tokens"] == 2
    assert {"queue_wait_s", "upstream_ttft_s", "total_s", "replica"} <= set(line)
    assert b"secret" not in log.read_bytes() and b"hello there" not in log.read_bytes()
    unknown = {**secret, "model": "no-such-model"}
    r = http.post(url + "/v1/chat/completions", json=unknown, headers={"x-request-id": "u1"})
    assert r.status_code == 404
    wait_until(lambda: b"u1" in log.read_bytes())
    refused = next(orjson.loads(raw) for raw in log.read_bytes().splitlines() if b'"u1"' in raw)
    assert refused["model"] == "-" and refused["requested_model"] == "no-such-model"
    assert refused["status"] == 404 and refused["received_at"] > 0  # `inferplane trace` reads both


def test_backends_can_be_replaced_while_serving(harness: Harness) -> None:  # noqa: F811
    old, new = harness.engine("m"), harness.engine("m")
    app, url = gateway(harness, [old.url])
    assert http.post(url + "/v1/chat/completions", json=CHAT).status_code == 200
    app.state.set_backends("m", [Backend(new.url)])
    assert http.post(url + "/v1/chat/completions", json=CHAT).status_code == 200
    assert len(old.requests) == 1 and len(new.requests) == 1
