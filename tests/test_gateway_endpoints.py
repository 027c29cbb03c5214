"""Every path a vLLM server exposes is routed by model or refused in OpenAI's error shape;
`/v1/models/{id}` respects per-key model lists; `/v1/responses` is billed and its by-id
routes reach the replica (and only the key) that made the response (issue 18.8)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from model_factory import embed_model_dir
from test_gateway_fakes import Harness
from test_openai_sdk_endpoints import SimFleet, start_fleet

from inferplane.gateway import GatewayConfig, ModelRoute
from inferplane.gateway.app import GatewayApp, build_app, usage_from
from inferplane.gateway.routes import MODEL_PATHS, REFUSED, ResponseOwners
from inferplane.sim.host import EngineHandle
from inferplane.store import Store
from inferplane.tenancy.keys import create_key
from inferplane.tenancy.ledger import usage_report
from inferplane.tenancy.service import Tenancy

# vLLM's HTTP routes, read from its route registrations (vllm-project/vllm at commit
# 055e47c2, the layout of the targeted release 0.33.0: vllm/frontend/entrypoints/**/
# api_router.py, serve/instrumentator/*.py, serve/sagemaker/api_router.py; the
# VLLM_SERVER_DEV_MODE, LoRA-updating, profiler, tokens-only and Cohere routes included).
VLLM_ROUTES: tuple[tuple[str, str], ...] = (
    ("GET", "/v1/models"),
    ("POST", "/v1/chat/completions"), ("POST", "/v1/chat/completions/batch"),
    ("POST", "/v1/completions"), ("POST", "/v1/responses"),
    ("GET", "/v1/responses/{response_id}"), ("POST", "/v1/responses/{response_id}/cancel"),
    ("POST", "/v1/messages"), ("POST", "/v1/messages/count_tokens"),
    ("POST", "/cohere/v2/chat"), ("POST", "/cohere/v2/chat/render"),
    ("POST", "/generative_scoring"),
    ("POST", "/v1/embeddings"), ("POST", "/v2/embed"), ("POST", "/pooling"),
    ("POST", "/classify"), ("POST", "/score"), ("POST", "/v1/score"), ("POST", "/rerank"),
    ("POST", "/v1/rerank"), ("POST", "/v2/rerank"),
    ("POST", "/v1/chat/completions/render"), ("POST", "/v1/messages/render"),
    ("POST", "/v1/completions/render"), ("POST", "/v1/chat/completions/derender"),
    ("POST", "/v1/completions/derender"), ("POST", "/inference/v1/generate"),
    ("POST", "/abort_requests"),
    ("POST", "/v1/audio/transcriptions"), ("POST", "/v1/audio/translations"),
    ("GET", "/v1/realtime"),  # a WebSocket route; a plain GET must still get JSON
    ("POST", "/tokenize"), ("POST", "/detokenize"), ("GET", "/tokenizer_info"),
    ("POST", "/v1/load_lora_adapter"), ("POST", "/v1/unload_lora_adapter"),
    ("POST", "/start_profile"), ("POST", "/stop_profile"),
    ("GET", "/health"), ("GET", "/metrics"), ("GET", "/load"), ("GET", "/version"),
    ("GET", "/ping"), ("POST", "/ping"), ("POST", "/invocations"),
    ("POST", "/scale_elastic_ep"), ("POST", "/is_scaling_elastic_ep"),
    ("POST", "/fault_tolerance/apply"), ("GET", "/fault_tolerance/status"),
    ("POST", "/reset_prefix_cache"), ("POST", "/reset_mm_cache"),
    ("POST", "/reset_encoder_cache"), ("POST", "/sleep"), ("POST", "/wake_up"),
    ("GET", "/is_sleeping"), ("POST", "/collective_rpc"), ("GET", "/server_info"),
    ("POST", "/pause"), ("POST", "/resume"), ("GET", "/is_paused"),
    ("POST", "/init_weight_transfer_engine"), ("POST", "/start_weight_update"),
    ("POST", "/start_draft_weight_update"), ("POST", "/update_weights"),
    ("POST", "/finish_weight_update"), ("POST", "/update_weight_version"),
    ("GET", "/weight_info"), ("GET", "/get_world_size"),
)  # fmt: skip
GATEWAY_OWN = {"/v1/models", "/health", "/metrics"}  # answered by the gateway itself
BY_ID = {"/v1/responses/{response_id}", "/v1/responses/{response_id}/cancel"}


async def call(
    app: GatewayApp, method: str, path: str, body: bytes = b"",
    headers: tuple[tuple[bytes, bytes], ...] = (),
) -> tuple[int, dict[bytes, bytes], bytes]:  # fmt: skip
    """One HTTP request straight into the ASGI app: (status, headers, body)."""
    sent: list[dict[str, Any]] = []
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await asyncio.Event().wait()  # the client stays: only a disconnect would come
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "query_string": b"",
             "headers": [(b"content-length", b"%d" % len(body)), *headers]}  # fmt: skip
    await app(scope, receive, send)  # type: ignore[arg-type]
    start = sent[0]
    assert start["type"] == "http.response.start"
    return (
        start["status"],
        dict(start["headers"]),
        b"".join(m.get("body", b"") for m in sent[1:]),
    )


def assert_openai_error(status: int, headers: dict[bytes, bytes], body: bytes) -> None:
    assert status >= 400
    assert headers[b"content-type"] == b"application/json"
    error = orjson.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str)


@pytest.fixture()
def bare() -> GatewayApp:
    """A gateway with one model and no replicas: routing stops before any upstream."""
    return build_app(GatewayConfig(models=(ModelRoute("m"),), access_log=False))


def test_every_vllm_route_is_routed_refused_or_the_gateways_own() -> None:
    for _, path in VLLM_ROUTES:
        assert path in MODEL_PATHS or path in REFUSED or path in GATEWAY_OWN or path in BY_ID, (
            f"{path}: add it to inferplane/gateway/routes.py (routed or refused with a reason)"
        )
    # Every refusal names why and what to use instead.
    for path, refusal in REFUSED.items():
        message = orjson.loads(refusal.body("POST", path))["error"]["message"]
        assert message.startswith(f"POST {path} is not served by the gateway: ")
        assert refusal.instead and refusal.instead in message


async def test_walk_vllm_routes(bare: GatewayApp) -> None:
    for method, template in VLLM_ROUTES:
        path = template.replace("{response_id}", "resp_x")
        body = orjson.dumps({"model": "m", "input": "x"}) if method == "POST" else b""
        status, headers, raw = await call(bare, method, path, body)
        if path in GATEWAY_OWN:
            assert status == 200, path
            continue
        assert_openai_error(status, headers, raw)
        if path in REFUSED:
            assert status == REFUSED[path].status
            assert "is not served by the gateway" in orjson.loads(raw)["error"]["message"]
        # Wrong method on a known path: still JSON.
        other = "GET" if method == "POST" else "DELETE"
        assert_openai_error(*(await call(bare, other, path)))


_SEGMENT = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-.~%", min_size=0, max_size=12)


@settings(max_examples=150, deadline=None)
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]),
    parts=st.lists(_SEGMENT, min_size=1, max_size=4),
    prefix=st.sampled_from(["", "/v1", "/v2", "/v1/models", "/v1/responses", "/admin"]),
)
def test_unknown_paths_and_methods_get_json_errors(
    method: str, parts: list[str], prefix: str
) -> None:
    app = build_app(GatewayConfig(models=(ModelRoute("m"),), access_log=False))
    path = prefix + "/" + "/".join(parts)
    if path in GATEWAY_OWN or path in ("/ready", "/v1/models/m"):
        return
    status, headers, body = asyncio.run(call(app, method, path, b""))
    assert_openai_error(status, headers, body)


async def test_websocket_handshake_is_denied_with_json(bare: GatewayApp) -> None:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "websocket", "path": "/v1/realtime", "headers": [],
             "extensions": {"websocket.http.response": {}}}  # fmt: skip
    await bare(scope, receive, send)  # type: ignore[arg-type]
    assert sent[0]["type"] == "websocket.http.response.start" and sent[0]["status"] == 501
    assert "WebSocket" in orjson.loads(sent[1]["body"])["error"]["message"]
    sent.clear()
    await bare({**scope, "extensions": {}}, receive, send)  # type: ignore[arg-type]
    assert sent == [{"type": "websocket.close", "code": 1008}]


def test_usage_from_counts_responses_api_usage() -> None:
    body = orjson.dumps({
        "id": "resp_1", "output": [{"content": [{"text": 'say "usage" twice'}]}],
        "usage": {"input_tokens": 12, "input_tokens_details": {"cached_tokens": 4},
                  "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 2},
                  "total_tokens": 19},
    })  # fmt: skip
    assert usage_from(body) == (12, 7)
    tail = b"event: response.completed\ndata: " + orjson.dumps({"response": orjson.loads(body)})
    assert usage_from(tail + b"\n\n") == (12, 7)
    chat = b'{"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}'
    assert usage_from(chat) == (3, 2)


def test_response_owners_are_bounded() -> None:
    owners = ResponseOwners(limit=2)
    for i in range(3):
        assert owners.learn(b'{"id":"resp_%d","output":[{"id":"msg_x"}]}' % i, "m", "u", None)
    assert owners.get("resp_0") is None and len(owners) == 2
    owner = owners.get("resp_2")
    assert owner is not None and (owner.model, owner.url) == ("m", "u")
    assert owners.learn(b"no id here", "m", "u", None) is None
    with pytest.raises(ValueError, match="limit must be at least 1"):
        ResponseOwners(limit=0)


# ---- with keys: a real store, tenancy and simulated engines ----------------------------


class KeyedFleet:
    def __init__(self, fleet: SimFleet, store: Store, tenancy: Tenancy) -> None:
        self.fleet, self.store, self.tenancy = fleet, store, tenancy

    def key(self, name: str, **kw: Any) -> str:
        _, secret = self.fleet.harness.run(create_key(self.store, name, **kw))
        self.fleet.harness.run(self.tenancy.refresh())
        return secret

    def get(self, path: str, key: str | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.get(self.fleet.url + path, headers=headers, timeout=10)

    def post(self, path: str, body: dict[str, Any], key: str | None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.post(self.fleet.url + path, json=body, headers=headers, timeout=10)


    def rows(self, expected_requests: int) -> dict[str, dict[str, Any]]:
        """The ledger by key name, once `expected_requests` rows were handed to it."""
        ledger = self.tenancy.ledger
        assert ledger is not None
        h = self.fleet.harness
        for _ in range(500):  # the handler records usage just after the client has it
            if ledger.written + ledger.pending >= expected_requests:
                break
            h.run(asyncio.sleep(0.01))
        h.run(ledger.flush())
        return {r["name"]: r for r in h.run(usage_report(self.store, "key"))}


def _keyed(tmp_path: Path, slowdown: float = 1.0) -> KeyedFleet:
    harness = Harness()
    store = harness.run(Store.open(f"sqlite:///{tmp_path / 'db.sqlite'}"))
    tenancy = Tenancy(store, auth="auto", refresh_s=0.05, ledger_flush_s=0.05)
    fleet = start_fleet(embed_model_dir(tmp_path), tenancy, harness=harness, slowdown=slowdown)
    return KeyedFleet(fleet, store, tenancy)


@pytest.fixture()
def keyed(tmp_path: Path) -> Iterator[KeyedFleet]:
    k = _keyed(tmp_path)
    yield k
    k.fleet.close()


def test_models_need_a_key_and_follow_its_model_list(keyed: KeyedFleet) -> None:
    everything = keyed.key("all")
    chat_only = keyed.key("chat-only", models=["chat"])
    expired = keyed.key("old", expires_in_s=10, now=time.time() - 60)
    for path in ("/v1/models", "/v1/models/chat"):
        for key in (None, "sk-wrong", expired):
            refused = keyed.get(path, key)
            assert refused.status_code == 401
            assert refused.json()["error"]["code"] == "invalid_api_key"
    assert [m["id"] for m in keyed.get("/v1/models", everything).json()["data"]] == [
        "chat", "embed"
    ]
    assert [m["id"] for m in keyed.get("/v1/models", chat_only).json()["data"]] == ["chat"]
    assert keyed.get("/v1/models/embed", everything).json()["id"] == "embed"
    hidden = keyed.get("/v1/models/embed", chat_only)  # exists, but not for this key
    assert hidden.status_code == 404 and hidden.json()["error"]["code"] == "model_not_found"


def test_responses_are_billed_and_private_to_their_key(keyed: KeyedFleet) -> None:
    alice, bob = keyed.key("alice"), keyed.key("bob")
    plain = keyed.post("/v1/responses", {"model": "chat", "input": "hello",
                                         "max_output_tokens": 5}, alice)  # fmt: skip
    assert plain.status_code == 200
    with httpx.stream("POST", keyed.fleet.url + "/v1/responses", timeout=10,
                      json={"model": "chat", "input": "stream me", "stream": True},
                      headers={"Authorization": f"Bearer {alice}"}) as streamed:  # fmt: skip
        raw = streamed.read()
    final = orjson.loads(raw.rstrip().split(b"\n")[-1][len(b"data: "):])["response"]
    expected = (
        plain.json()["usage"]["input_tokens"] + final["usage"]["input_tokens"],
        plain.json()["usage"]["output_tokens"] + final["usage"]["output_tokens"],
    )
    rid = plain.json()["id"]
    assert keyed.get(f"/v1/responses/{rid}", alice).json()["id"] == rid
    assert keyed.get(f"/v1/responses/{final['id']}", alice).status_code == 200
    stolen = keyed.get(f"/v1/responses/{rid}", bob)  # another key: as if it did not exist
    assert stolen.status_code == 404
    assert stolen.json()["error"]["message"] == f"Response with id '{rid}' not found."
    assert keyed.get(f"/v1/responses/{rid}").status_code == 401  # auth is on
    # Nor may another key continue it (the engine would answer with alice's conversation).
    hijack = keyed.post("/v1/responses", {"model": "chat", "input": "and then?",
                                          "previous_response_id": rid}, bob)  # fmt: skip
    assert hijack.status_code == 404
    assert hijack.json()["error"]["message"] == f"Response with id '{rid}' not found."
    follow = keyed.post("/v1/responses", {"model": "chat", "input": "and then?",
                                          "previous_response_id": rid}, alice)  # fmt: skip
    assert follow.status_code == 200 and follow.json()["previous_response_id"] == rid
    expected = (expected[0] + follow.json()["usage"]["input_tokens"],
                expected[1] + follow.json()["usage"]["output_tokens"])  # fmt: skip
    rows = keyed.rows(4)
    assert rows["alice"]["requests"] == 3
    assert rows["bob"]["requests"] == 1 and rows["bob"]["errors"] == 1
    assert (rows["alice"]["prompt_tokens"], rows["alice"]["completion_tokens"]) == expected
    assert expected[1] > 0


def test_max_output_tokens_is_capped_and_checked(keyed: KeyedFleet) -> None:
    key = keyed.key("capped")
    big = keyed.post("/v1/responses", {"model": "chat", "input": "x",
                                       "max_output_tokens": 1000, "ignore_eos": True}, key)
    assert big.status_code == 200
    assert big.json()["max_output_tokens"] == 64  # the route's max_tokens_cap
    assert big.json()["usage"]["output_tokens"] == 64
    bad = keyed.post("/v1/responses", {"model": "chat", "input": "x",
                                       "max_output_tokens": "lots"}, key)  # fmt: skip
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_output_tokens"


def test_a_lost_response_mapping_is_a_404(keyed: KeyedFleet) -> None:
    key = keyed.key("forgetful")
    made = keyed.post("/v1/responses", {"model": "chat", "input": "x",
                                        "max_output_tokens": 2}, key).json()  # fmt: skip
    keyed.fleet.app.responses = ResponseOwners()  # e.g. after a gateway restart
    lost = keyed.get(f"/v1/responses/{made['id']}", key)
    assert lost.status_code == 404
    assert lost.json()["error"] == {
        "message": f"Response with id '{made['id']}' not found.",
        "type": "invalid_request_error", "param": "response_id", "code": 404,
    }  # fmt: skip
    wrong = httpx.delete(keyed.fleet.url + f"/v1/responses/{made['id']}", timeout=10,
                         headers={"Authorization": f"Bearer {key}"})  # fmt: skip
    assert wrong.status_code == 405 and wrong.json()["error"]["message"] == "use GET"


def test_a_responses_stream_cut_short_is_billed_for_its_text_deltas(tmp_path: Path) -> None:
    """The engine's usage never arrives: the bill is the prompt estimate and one token per
    `response.output_text.delta` relayed, not per SSE event (most carry no token)."""
    keyed = _keyed(tmp_path, slowdown=200.0)  # slow enough to cut the stream mid-way
    try:
        key = keyed.key("cut")
        body = {"model": "chat", "input": "a long one", "stream": True,
                "max_output_tokens": 60, "ignore_eos": True}  # fmt: skip
        raw = b""
        with httpx.stream("POST", keyed.fleet.url + "/v1/responses", json=body, timeout=30,
                          headers={"Authorization": f"Bearer {key}"}) as streamed:  # fmt: skip
            chunks = streamed.iter_bytes()
            while raw.count(b"event: response.output_text.delta") < 3:
                raw += next(chunks)
            app = keyed.fleet.app
            ended = keyed.fleet.harness.run(_end_in_flight(app, keyed.fleet.engines))
            assert ended == 1
            raw += b"".join(chunks)
        assert b"response.completed" not in raw  # cut short: no usage from the engine
        assert b"failed mid-stream" in raw
        deltas = raw.count(b"event: response.output_text.delta")
        row = keyed.rows(1)["cut"]
        assert row["completion_tokens"] == deltas
        assert row["prompt_tokens"] > 0
    finally:
        keyed.fleet.close()


async def _end_in_flight(app: GatewayApp, engines: list[EngineHandle]) -> int:
    return sum(app.end_in_flight(e.url, "test: replica killed") for e in engines)
