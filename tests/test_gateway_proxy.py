"""The gateway against fake vLLM engines over real sockets: the OpenAI API surface."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import orjson
import pytest
from test_gateway_fakes import FakeEngine, Harness, async_http_client, harness, http  # noqa: F401

from inferplane.gateway import Backend, GatewayConfig, ModelRoute, WeightedRoute, WeightedTarget
from inferplane.gateway.app import GatewayApp

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture()
def setup(harness: Harness) -> tuple[FakeEngine, GatewayApp, str]:  # noqa: F811
    engine = harness.engine("llama-8b-instruct")
    config = GatewayConfig(
        models=(
            ModelRoute(
                "llama-8b",
                endpoints=(engine.url,),
                served_name="llama-8b-instruct",
                aliases=("chat",),
                max_tokens_cap=100,
            ),
            ModelRoute("embedder", served_name="llama-8b-instruct"),  # replicas come later
        ),
        routes=(WeightedRoute("canary", (WeightedTarget("llama-8b", 1),)),),
        access_log=False,
    )
    app, url = harness.gateway(config)
    return engine, app, url


def direct(engine: FakeEngine, path: str, body: dict[str, object]) -> httpx.Response:
    return http.post(engine.url + path, content=orjson.dumps(body))


def test_chat_response_is_byte_identical_to_the_engines(
    setup: tuple[FakeEngine, GatewayApp, str],
) -> None:
    engine, _, url = setup
    via = http.post(url + "/v1/chat/completions", json=CHAT, headers={"X-Request-ID": "req-1"})
    assert via.status_code == 200
    assert via.headers["x-request-id"] == "req-1"
    sent = engine.requests[-1]
    assert sent["model"] == "llama-8b-instruct"  # the served name (P36)
    assert sent["max_tokens"] == 100  # the cap applies when the client sets none
    assert engine.headers[-1]["X-Request-ID"] == "req-1"
    same = direct(engine, "/v1/chat/completions", sent)
    assert via.content == same.content


def test_stream_is_byte_identical_and_counts_usage(
    setup: tuple[FakeEngine, GatewayApp, str],
) -> None:
    engine, _app, url = setup
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    with http.stream("POST", url + "/v1/chat/completions", json=body) as via:
        assert via.headers["content-type"].startswith("text/event-stream")
        assert via.headers["x-request-id"]
        got = via.read()
    same = direct(engine, "/v1/chat/completions", engine.requests[-1])
    assert got == same.content and got.endswith(b"data: [DONE]\n\n")
    metrics = http.get(url + "/metrics").text
    assert 'inferplane_tokens_total{kind="completion",model="llama-8b"}' in metrics


def test_generated_request_id_is_returned_and_forwarded(
    setup: tuple[FakeEngine, GatewayApp, str],
) -> None:
    engine, _, url = setup
    r = http.post(url + "/v1/chat/completions", json=CHAT)
    assert r.headers["x-request-id"] == engine.headers[-1]["X-Request-ID"]


def test_embeddings_and_tokenize_pass_through(setup: tuple[FakeEngine, GatewayApp, str]) -> None:
    engine, _, url = setup
    r = http.post(url + "/v1/embeddings", json={"model": "chat", "input": "hello"})
    assert r.status_code == 200 and r.json()["data"][0]["embedding"] == [0.5, -0.25]
    r = http.post(url + "/tokenize", json={"model": "llama-8b", "prompt": "hello"})
    assert r.status_code == 200 and r.json()["tokens"] == [1, 2, 3]
    assert engine.requests[-1]["model"] == "llama-8b-instruct"


def test_max_tokens_is_clamped(setup: tuple[FakeEngine, GatewayApp, str]) -> None:
    engine, _, url = setup
    r = http.post(url + "/v1/chat/completions", json={**CHAT, "max_tokens": 5000})
    assert r.status_code == 200 and engine.requests[-1]["max_tokens"] == 100


def test_max_tokens_reject_mode(harness: Harness) -> None:  # noqa: F811
    engine = harness.engine("m")
    route = ModelRoute("m", endpoints=(engine.url,), max_tokens_cap=10, max_tokens_mode="reject")
    _, url = harness.gateway(GatewayConfig(models=(route,), access_log=False))
    r = http.post(url + "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 11})
    assert r.status_code == 400
    assert (
        r.json()["error"]["param"] == "max_tokens" and "cap of 10" in r.json()["error"]["message"]
    )
    assert engine.requests == []


def test_unknown_model_is_a_404_in_openai_shape(setup: tuple[FakeEngine, GatewayApp, str]) -> None:
    engine, _, url = setup
    before = len(engine.requests)
    r = http.post(url + "/v1/chat/completions", json={**CHAT, "model": "gpt-4"})
    assert r.status_code == 404
    error = r.json()["error"]
    assert error["code"] == "model_not_found" and "gpt-4" in error["message"]
    assert len(engine.requests) == before  # never a fallback (P36)
    # one shape for an unknown model (before: `"code": 404` here, a string on /v1/models)
    assert http.get(url + "/v1/models/gpt-4").json()["error"] == error


def test_a_browser_at_the_root_goes_to_the_console(
    setup: tuple[FakeEngine, GatewayApp, str],
) -> None:
    from inferplane.console import attach

    _, app, url = setup
    html = {"accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
    assert http.get(url + "/", headers=html).status_code == 404  # no console: JSON 404
    attach(app, None, "INFERPLANE_ADMIN_TOKEN")
    r = http.get(url + "/", headers=html, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui"
    api = http.get(url + "/", headers={"accept": "application/json"})
    assert api.status_code == 404 and api.json()["error"]["code"] == 404  # clients keep JSON


def test_a_missing_key_reads_the_same_on_chat_and_models(harness: Harness) -> None:  # noqa: F811
    from inferplane.gateway.app import build_app
    from inferplane.tenancy.service import Tenancy

    engine = harness.engine("m")
    app = build_app(GatewayConfig(models=(ModelRoute("m", endpoints=(engine.url,)),),
                                  access_log=False), Tenancy(None, auth="on"))
    url = harness.serve(app)
    for headers in ({}, {"authorization": "Bearer wrong"}):
        chat = http.post(url + "/v1/chat/completions", json={**CHAT, "model": "m"},
                         headers=headers)
        models = http.get(url + "/v1/models", headers=headers)
        assert chat.status_code == models.status_code == 401
        assert chat.json() == models.json()  # before: two wordings of a missing key


def test_models_lists_names_aliases_and_routes(setup: tuple[FakeEngine, GatewayApp, str]) -> None:
    _, _, url = setup
    data = http.get(url + "/v1/models").json()
    assert data["object"] == "list"
    assert {m["id"] for m in data["data"]} == {"llama-8b", "chat", "embedder", "canary"}


def test_health_ready_and_backends_changed_at_run_time(
    setup: tuple[FakeEngine, GatewayApp, str],
) -> None:
    engine, app, url = setup
    assert http.get(url + "/health").status_code == 200
    ready = http.get(url + "/ready")
    assert ready.status_code == 503 and ready.json()["models_without_replicas"] == ["embedder"]
    r = http.post(url + "/v1/embeddings", json={"model": "embedder", "input": "x"})
    assert r.status_code == 503 and "retry-after" in r.headers
    app.state.set_backends("embedder", [Backend(engine.url, ready=True)])
    assert http.get(url + "/ready").status_code == 200
    r = http.post(url + "/v1/embeddings", json={"model": "embedder", "input": "x"})
    assert r.status_code == 200
    app.state.set_backends("embedder", [Backend(engine.url, ready=False)])
    assert http.get(url + "/ready").status_code == 503


def test_metrics_use_the_gateway_namespace(setup: tuple[FakeEngine, GatewayApp, str]) -> None:
    _, _, url = setup
    http.post(url + "/v1/chat/completions", json=CHAT)
    text = http.get(url + "/metrics").text
    for name in (
        "inferplane_requests_total",
        "inferplane_requests_in_flight",
        "inferplane_queue_depth",
        "inferplane_queue_wait_seconds",
        "inferplane_upstream_ttft_seconds",
        "inferplane_request_duration_seconds",
    ):
        assert name in text
    assert "\nvllm:" not in text


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b'{"messages": []}', "model"),
        (b'{"model": 7, "messages": []}', "model"),
        (b'{"model": "chat", "messages": [], "stream": "yes"}', "stream"),
        (b'{"model": "chat", "messages": [], "max_tokens": "9"}', "max_tokens"),
        (b'{"model": "chat", "messages": "hi"}', "messages"),
    ],
)
def test_bad_bodies_get_400_in_openai_shape(
    setup: tuple[FakeEngine, GatewayApp, str], body: bytes, param: str | None
) -> None:
    _, _, url = setup
    r = http.post(url + "/v1/chat/completions", content=body)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == param


def test_body_over_the_limit_is_413_naming_the_limit(harness: Harness) -> None:  # noqa: F811
    engine = harness.engine("m")
    config = GatewayConfig(models=(ModelRoute("m", endpoints=(engine.url,)),), max_body_bytes=4096)
    _, url = harness.gateway(config)
    big = {"model": "m", "prompt": "x" * 5000}
    r = http.post(url + "/v1/completions", json=big)
    assert r.status_code == 413 and "4096 bytes" in r.json()["error"]["message"]

    def chunks():  # type: ignore[no-untyped-def]  # no Content-Length: chunked upload
        yield b'{"model": "m", "prompt": "'
        yield b"y" * 5000
        yield b'"}'

    r = http.post(url + "/v1/completions", content=chunks())
    assert r.status_code == 413


def test_unknown_path_and_method(setup: tuple[FakeEngine, GatewayApp, str]) -> None:
    _, _, url = setup
    assert http.get(url + "/v1/nothing").status_code == 404
    assert http.get(url + "/v1/chat/completions").status_code == 405


def test_openai_client_sync(setup: tuple[FakeEngine, GatewayApp, str]) -> None:
    _, _, url = setup
    client = openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0)
    reply = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.choices[0].message.content == "hello there" and reply.usage is not None
    stream = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "tok0 tok1 tok2 tok3 tok4 "
    emb = client.embeddings.create(model="chat", input="hello")
    assert emb.data[0].embedding == [0.5, -0.25]
    models = [m.id for m in client.models.list()]
    assert "chat" in models
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


async def test_openai_client_async(setup: tuple[FakeEngine, GatewayApp, str]) -> None:
    _, _, url = setup
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0)

    async def one(i: int) -> str:
        stream = await client.chat.completions.create(
            model="canary", messages=[{"role": "user", "content": f"hi {i}"}], stream=True
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    texts = await asyncio.gather(*(one(i) for i in range(8)))
    assert set(texts) == {"tok0 tok1 tok2 tok3 tok4 "}
    reply = await client.completions.create(model="chat", prompt="hi")
    assert reply.choices  # the fake answers completions with a chat-shaped body; parsed anyway
    await client.close()


@pytest.mark.parametrize("one_write", [False, True])
def test_a_stream_without_usage_is_counted_by_its_token_events(
    harness: Harness,  # noqa: F811
    tmp_path: Any,
    one_write: bool,
) -> None:
    """No usage from the engine (none asked for): the access log counts the token events,
    whether the stream came in pieces or whole (the relay's last piece goes with the end)."""
    engine = harness.engine("m")
    engine.chunks = 7
    if one_write:
        pieces = engine.stream_bytes
        engine.stream_bytes = lambda raw, model, usage: [  # type: ignore[method-assign]
            b"".join(pieces(raw, model, usage))
        ]
        engine.last_with_end = True
    log = tmp_path / "access.log"
    config = GatewayConfig(models=(ModelRoute("m", endpoints=(engine.url,)),),
                           access_log_path=str(log))  # fmt: skip
    app, url = harness.gateway(config)
    with http.stream("POST", url + "/v1/chat/completions",
                     json={"model": "m", "messages": [], "stream": True}) as r:  # fmt: skip
        got = r.read()
    assert got.count(b"data: ") == 8 and got.endswith(b"data: [DONE]\n\n")
    harness.run(app.access_log.stop())  # type: ignore[union-attr]
    row = orjson.loads(log.read_text().splitlines()[-1])
    assert row["completion_tokens"] == 7
