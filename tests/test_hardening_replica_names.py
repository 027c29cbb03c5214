"""Issue 30 item 17: nothing a client can read without a token names an engine's address.

Generated fleets of live, dying (cut mid-stream) and unreachable endpoints on many loopback
hosts and ports, under default settings: every answer's headers and body (200s, 502s, the
SSE error events of a cut stream, an unknown model's 404), `/metrics`, `/ready`, `/health`
and `/v1/models` are searched for each engine's URL, host:port and host. Replicas are named
instead (`m-endpoint-0`; `chat-0` for an instance of `inferplane up`; a discovered pod).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_gateway_fakes import FakeEngine, Harness, http

from inferplane.gateway import GatewayConfig, ModelRoute
from inferplane.gateway.backend import Backend, endpoint_name, failure_text


@dataclass
class Engines:
    harness: Harness
    live: FakeEngine
    dying: FakeEngine


@pytest.fixture(scope="module")
def engines() -> Iterator[Engines]:
    h = Harness()
    live = h.engine("m")
    dying = h.engine("m")
    dying.die_after_chunks = 2  # every stream it serves is cut after two chunks
    yield Engines(h, live, dying)
    h.close()


def dead_url(host: str) -> str:
    """A loopback address nothing listens on (the OS picked a free port, now closed)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return f"http://{host}:{s.getsockname()[1]}"


ENDPOINT = st.one_of(
    st.just("live"), st.just("dying"),
    st.tuples(st.integers(0, 255), st.integers(0, 255), st.integers(1, 254)),
)  # fmt: skip
FLEET = st.lists(st.lists(ENDPOINT, min_size=1, max_size=3), min_size=1, max_size=3)


def _answers(base: str, models: list[str]) -> list[httpx.Response]:
    out = [http.get(base + path) for path in ("/metrics", "/ready", "/health", "/v1/models")]
    for model in [*models, "not-served"]:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
        out.append(http.post(base + "/v1/chat/completions", json=body))
        with http.stream("POST", base + "/v1/chat/completions",
                         json={**body, "stream": True}) as r:  # fmt: skip
            r.read()
            out.append(r)
    out.append(http.get(base + "/metrics"))  # after the failures and ejections
    return out


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(fleet=FLEET)
def test_no_engine_address_reaches_a_client_or_metrics(
    engines: Engines, fleet: list[list[object]]
) -> None:
    routes = []
    secrets: set[str] = set()
    for m, endpoints in enumerate(fleet):
        urls = []
        for ep in endpoints:
            if ep == "live":
                url = engines.live.url
            elif ep == "dying":
                url = engines.dying.url
            else:
                assert isinstance(ep, tuple)
                url = dead_url("127.{}.{}.{}".format(*ep))
            if url not in urls:
                urls.append(url)
        for url in urls:
            hostport = url.removeprefix("http://")
            secrets |= {url, hostport, hostport.rpartition(":")[0]}
        routes.append(ModelRoute(f"model-{m}", endpoints=tuple(urls)))
    _, base = engines.harness.gateway(GatewayConfig(models=tuple(routes), access_log=False))
    seen = _answers(base, [r.name for r in routes])
    statuses = {r.status_code for r in seen}
    assert statuses <= {200, 404, 502, 503}, statuses
    for r in seen:
        text = "\n".join(f"{k}: {v}" for k, v in r.headers.items()) + "\n" + r.text
        leaked = [s for s in secrets if s in text]
        assert not leaked, (r.request.url, leaked, text[:2000])
    metrics = seen[-1].text
    for route in routes:  # the replicas are there, by name
        assert f'replica="{endpoint_name(route.name, 0)}"' in metrics


def test_a_502_names_the_replica_that_failed(engines: Engines) -> None:
    dead = dead_url("127.0.0.1")
    config = GatewayConfig(models=(ModelRoute("m", endpoints=(dead,)),), access_log=False)
    _, base = engines.harness.gateway(config)
    r = http.post(base + "/v1/chat/completions",
                  json={"model": "m", "messages": [{"role": "user", "content": "x"}]})  # fmt: skip
    assert r.status_code == 502 and "m-endpoint-0" in r.json()["error"]["message"]


def test_replica_names() -> None:
    assert Backend("http://10.0.0.5:8000", name="chat-0").label == "chat-0"
    unnamed = Backend("http://10.0.0.5:8000")
    assert unnamed.label.startswith("replica-") and "10.0.0.5" not in unnamed.label
    assert unnamed.public == unnamed.label


async def test_an_aiohttp_connection_error_is_told_without_the_address() -> None:
    import aiohttp

    dead = dead_url("127.9.8.7")
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientError) as caught:
            await session.get(dead + "/v1/responses/resp_1")
    assert "127.9.8.7" in repr(caught.value)  # what the 502 of GET /v1/responses/{id} said
    text = failure_text(caught.value, Backend(dead, name="chat-0"))
    assert "127.9.8.7" not in text and dead.rpartition(":")[2] not in text
    assert text.startswith("ClientConnectorError: ")


async def test_a_restart_reason_names_no_engine_address() -> None:
    """An engine that stopped listening: the supervisor's reason ends streams and 502s
    (`chat-0 restarting: 3 consecutive failed health checks; last: ...`)."""
    import aiohttp

    from inferplane.runtime.instances import Instance
    from inferplane.runtime.supervisor import probe_live, probe_ready

    port = int(dead_url("127.0.0.1").rpartition(":")[2])
    inst = Instance("chat-0", "chat", "chat", 0, port, "sim", ())
    async with aiohttp.ClientSession() as session:
        reasons = [await probe(session, inst, 2.0) for probe in (probe_live, probe_ready)]
    for why in reasons:
        assert why is not None and str(port) not in why and "127.0.0.1" not in why, why
        assert why.startswith("ClientConnectorError: ")
