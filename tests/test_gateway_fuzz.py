"""Property-based fuzzing: malformed, oversized, wrongly typed and truncated requests get a
4xx in OpenAI's error shape, never a 5xx, a hang or a crash, and valid traffic still flows."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_gateway_fakes import Harness, harness, http_client  # noqa: F401

from inferplane.gateway import GatewayConfig, ModelRoute, build_app
from inferplane.gateway.app import GatewayApp

PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/tokenize"]
VALID = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)  # what JSON encoders accept
json_values = st.recursive(
    st.none() | st.booleans() | ints | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
# Bodies with a wrong "model" (missing, wrong type, or unknown): the gateway itself must refuse.
bad_model = st.one_of(
    st.none(), ints, st.booleans(), st.lists(st.text(max_size=3), max_size=2),
    st.just(""), st.text(min_size=1, max_size=30).filter(lambda s: s != "m"),
)  # fmt: skip
bodies = st.one_of(
    st.binary(max_size=300),  # arbitrary bytes
    json_values.map(orjson.dumps),  # JSON that is not an object, or lacks a model
    st.builds(
        lambda model, extra: orjson.dumps({**extra, "model": model}),
        bad_model,
        st.dictionaries(
            st.sampled_from(["messages", "prompt", "stream", "max_tokens"]), json_values
        ),
    ),
    # A valid body truncated anywhere.
    st.integers(min_value=0, max_value=len(orjson.dumps(VALID)) - 1).map(
        lambda n: orjson.dumps(VALID)[:n]
    ),
    # Valid model, wrongly typed fields the gateway relies on.
    st.builds(
        lambda field, value: orjson.dumps({**VALID, field: value}),
        st.sampled_from(["stream", "max_tokens", "max_completion_tokens", "messages"]),
        st.one_of(
            st.text(max_size=5),
            st.floats(allow_nan=False),
            st.dictionaries(st.text(max_size=3), ints, max_size=2),
        ),
    ),
)
# Printable ASCII; clients cannot send surrounding whitespace (HTTP strips it).
header_text = st.text(
    alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=200
).map(str.strip)


@pytest.fixture(scope="module")
def gateway_url(harness: Harness) -> Iterator[str]:  # noqa: F811
    engine = harness.engine("m")
    config = GatewayConfig(
        models=(
            ModelRoute(
                "m",
                endpoints=(engine.url,),
                max_tokens_cap=64,
                scorers=("prefix_affinity", "session_affinity", "least_outstanding"),
            ),
        ),
        max_body_bytes=2048,
        access_log=False,
    )
    _, url = harness.gateway(config)
    yield url  # headers go over real sockets: the HTTP layer is part of what is fuzzed


class AsgiCaller:
    """Calls the gateway's ASGI app in-process: the fuzzed paths fail before any upstream
    call, so sockets would only slow hypothesis down."""

    def __init__(self, app: GatewayApp) -> None:
        self.app = app
        self.loop = asyncio.new_event_loop()

    def post(self, path: str, chunks: list[bytes]) -> tuple[int, bytes]:
        return self.loop.run_until_complete(self._post(path, chunks))

    async def _post(self, path: str, chunks: list[bytes]) -> tuple[int, bytes]:
        messages = [
            {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
            for i, c in enumerate(chunks)
        ]
        sent: list[dict[str, object]] = []

        async def receive() -> dict[str, object]:
            if messages:
                return messages.pop(0)
            await asyncio.sleep(3600)  # a client that stays connected
            return {"type": "http.disconnect"}

        async def send(message: dict[str, object]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": path, "headers": []}
        await asyncio.wait_for(self.app(scope, receive, send), timeout=5)
        status = sent[0]["status"]
        body = b"".join(m.get("body", b"") for m in sent[1:])  # type: ignore[misc]
        return status, body  # type: ignore[return-value]


@pytest.fixture(scope="module")
def caller(harness: Harness) -> Iterator[AsgiCaller]:  # noqa: F811
    engine = harness.engine("m")
    config = GatewayConfig(
        models=(ModelRoute("m", endpoints=(engine.url,), max_tokens_cap=64),),
        max_body_bytes=2048,
        access_log=False,
    )
    c = AsgiCaller(build_app(config))
    yield c
    c.loop.run_until_complete(c.app.shutdown())
    c.loop.close()


def _error_code_matches(status: int, code: object) -> bool:
    # the status as the code (vLLM's shape), except an unknown model: OpenAI's own
    # `model_not_found` on every route (docs/gateway.md)
    return code == status or (status == 404 and code == "model_not_found")


def assert_openai_error(status: int, body: bytes) -> None:
    assert 400 <= status < 500, (status, body[:200])
    error = orjson.loads(body)["error"]
    assert isinstance(error["message"], str) and _error_code_matches(status, error["code"])


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with http_client(timeout=5) as c:
        yield c


def assert_openai_4xx(r: httpx.Response) -> None:
    assert 400 <= r.status_code < 500, (r.status_code, r.content[:200])
    error = r.json()["error"]
    assert isinstance(error["message"], str) and _error_code_matches(r.status_code, error["code"])


@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
@given(path=st.sampled_from(PATHS), body=bodies, split=st.integers(min_value=0, max_value=300))
def test_malformed_bodies_get_4xx(caller: AsgiCaller, path: str, body: bytes, split: int) -> None:
    status, reply = caller.post(path, [body[:split], body[split:]])
    if status == 200:
        # Hypothesis found a body the gateway accepts: then the engine answered it.
        assert orjson.loads(body)["model"] == "m"
        return
    assert_openai_error(status, reply)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(size=st.integers(min_value=2049, max_value=20_000), pieces=st.integers(1, 5))
def test_oversized_bodies_get_413(caller: AsgiCaller, size: int, pieces: int) -> None:
    body = orjson.dumps({"model": "m", "prompt": "x" * size})
    step = len(body) // pieces + 1
    status, reply = caller.post(
        "/v1/completions", [body[i : i + step] for i in range(0, len(body), step)]
    )
    assert status == 413
    assert_openai_error(status, reply)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(request_id=header_text, session=header_text, priority=header_text)
def test_odd_headers_never_break_valid_requests(
    gateway_url: str, client: httpx.Client, request_id: str, session: str, priority: str
) -> None:
    headers = {"x-request-id": request_id, "x-session-id": session, "x-priority": priority}
    r = client.post(
        gateway_url + "/v1/chat/completions", content=orjson.dumps(VALID), headers=headers
    )
    assert r.status_code == 200
    if 0 < len(request_id) <= 128:
        assert r.headers["x-request-id"] == request_id
    else:
        assert r.headers["x-request-id"]  # too long or empty: the gateway made its own


def raw_post(url: str, content_length: str, body: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + b"Content-Length: "
            + content_length.encode()
            + b"\r\nConnection: close\r\n\r\n"
            + body
        )
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize(
    ("length", "expected"),
    [("5", b" 400 "), ("99999999", b" 413 "), ("abc", b" 400 "), ("-1", b" 400 ")],
)
def test_lying_content_length_is_refused(gateway_url: str, length: str, expected: bytes) -> None:
    reply = raw_post(gateway_url, length, orjson.dumps(VALID))
    assert reply.split(b"\r\n", 1)[0].endswith(expected.strip()) or expected in reply[:20]


def test_valid_traffic_still_flows_after_fuzzing(gateway_url: str, client: httpx.Client) -> None:
    for _ in range(20):
        assert client.post(gateway_url + "/v1/chat/completions", json=VALID).status_code == 200
    assert client.get(gateway_url + "/health").status_code == 200
