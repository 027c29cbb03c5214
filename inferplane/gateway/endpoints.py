"""The gateway's own routes, off the proxy path: model listing, readiness, metrics,
`/v1/responses/{id}`, the console and admin mounts, refusals (vLLM routes the gateway does
not serve, WebSocket handshakes) and 404/405s."""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING, Any

import orjson

from inferplane.gateway.asgi import JSON_HEADER, Receive, Scope, Send, header, respond
from inferplane.gateway.errors import ClientError, error_body
from inferplane.gateway.refusals import key_refusal, send_redirect, wants_html
from inferplane.gateway.routes import (
    MODEL_PATHS,
    MODELS_PREFIX,
    REFUSED,
    RESPONSES_PREFIX,
    model_not_found,
    response_not_found,
    split_response_path,
)

if TYPE_CHECKING:
    from inferplane.gateway.app import GatewayApp
    from inferplane.tenancy.keys import KeyPolicy

_NO_METRICS_TOKEN = error_body(401, "metrics need the scrape token: 'Authorization: Bearer ...'")


async def dispatch(app: GatewayApp, scope: Scope, receive: Receive, send: Send) -> None:
    """Every HTTP request but a model-addressed POST (the proxy's)."""
    path = scope["path"]
    method = scope["method"]
    if path in MODEL_PATHS:
        await respond(send, 405, error_body(405, "use POST"))
    elif method == "GET" and path == "/v1/models":
        await models(app, scope, send, None)
    elif path.startswith(MODELS_PREFIX):
        if method == "GET":
            await models(app, scope, send, path[len(MODELS_PREFIX) :])
        else:
            await respond(send, 405, error_body(405, "use GET"))
    elif path.startswith(RESPONSES_PREFIX):
        await response_by_id(app, scope, receive, send, path)
    elif method == "GET" and path == "/health":
        await respond(send, 200, b'{"status":"ok"}')
    elif method == "GET" and path == "/ready":
        await ready(app, send)
    elif path == "/ui" or path.startswith("/ui/"):
        if app.console is None:
            message = "the web console is off (gateway.console: false, or up --no-console)"
            await respond(send, 404, error_body(404, message))
        else:
            await app.console(scope, receive, send)
    elif path.startswith("/admin/") and app.tenancy is not None:
        from inferplane.tenancy.admin import handle

        await handle(app.tenancy, scope, receive, send)
    elif method == "GET" and path == "/metrics":
        await metrics(app, scope, send)
    elif path in REFUSED:  # vLLM routes the gateway does not serve, and why
        await respond(send, REFUSED[path].status, REFUSED[path].body(method, path))
    elif path == "/" and method == "GET" and app.console is not None and wants_html(
            header(scope, b"accept")):  # fmt: skip
        await send_redirect(send, "/ui")  # a browser at the root: the console
    else:
        await respond(send, 404, error_body(404, f"no route for {method} {path}"))


def caller_key(app: GatewayApp, scope: Scope) -> tuple[bool, KeyPolicy | None]:
    """(allowed, key) for the gateway's own GET routes: as OpenAI and `vllm serve
    --api-key`, a valid, unexpired key is needed when auth is on."""
    tenancy = app.tenancy
    if tenancy is None:
        return True, None
    policy = tenancy.authenticate(header(scope, b"authorization"))
    if policy is not None and policy.expires_at is not None and (
        policy.expires_at <= tenancy.clock()
    ):
        policy = None
    return policy is not None or not tenancy.auth_required, policy


async def models(app: GatewayApp, scope: Scope, send: Send, model_id: str | None) -> None:
    """`GET /v1/models` and `GET /v1/models/{id}` (vLLM has only the list): the names a
    client can address, less those the caller's key may not use."""
    allowed, policy = caller_key(app, scope)
    if not allowed:
        await respond(send, 401, key_refusal(header(scope, b"authorization")))
        return
    names = app.state.client_names()
    if policy is not None and policy.allowed_models is not None:
        names = [name for name in names if name in policy.allowed_models]
    created = app.models_created
    if model_id is None:
        data = [_model_card(app, name, created) for name in names]
        await respond(send, 200, orjson.dumps({"object": "list", "data": data}))
    elif model_id in names:
        await respond(send, 200, orjson.dumps(_model_card(app, model_id, created)))
    else:  # unknown and not-for-this-key look the same: no existence leak
        await respond(send, 404, model_not_found(model_id))


def _model_card(app: GatewayApp, name: str, created: int) -> dict[str, Any]:
    card: dict[str, Any] = {"id": name, "object": "model", "created": created,
                            "owned_by": "inferplane"}  # fmt: skip
    parent = app.state.parent_of(name)
    if parent is not None:  # a LoRA adapter: its base model, as vLLM lists it
        card["parent"] = parent
    return card


async def response_by_id(
    app: GatewayApp, scope: Scope, receive: Receive, send: Send, path: str
) -> None:
    """`GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel`: to the replica
    that made the response (`app.responses`), for the key that made it."""
    method = scope["method"]
    parsed = split_response_path(path)
    if parsed is None:
        await respond(send, 404, error_body(404, f"no route for {method} {path}"))
        return
    response_id, action = parsed
    want = "POST" if action else "GET"
    if method != want:
        await respond(send, 405, error_body(405, f"use {want}"))
        return
    allowed, policy = caller_key(app, scope)
    if not allowed:
        await respond(send, 401, key_refusal(header(scope, b"authorization")))
        return
    key_id = policy.id if policy is not None else None
    rid = app.acceptor.ids.next()
    owner = app.responses.get(response_id)
    pool = app.state.pools.get(owner.model) if owner is not None else None
    backend = None
    if owner is not None and pool is not None and owner.key_id in (None, key_id):
        backend = next((b for b in pool.backends if b.url == owner.url), None)
    if owner is None or pool is None or backend is None:  # unknown, lost, or not yours
        await respond(send, 404, response_not_found(response_id), rid)
        return
    try:
        body = await app.acceptor.body(receive, header(scope, b"content-length"))
    except ClientError as exc:
        await respond(send, exc.status, error_body(exc.status, exc.message), rid)
        return
    lines = b"X-Request-ID: " + rid + b"\r\n"
    auth = header(scope, b"authorization")
    if backend.api_key:
        lines += b"Authorization: Bearer " + backend.api_key.encode() + b"\r\n"
    elif key_id is None and auth is not None:
        lines += b"Authorization: " + auth + b"\r\n"  # no gateway key: the engine's
    query = scope.get("query_string", b"")
    target = path + ("?" + query.decode("latin-1") if query else "")
    await app.forwarder.forward_by_id(backend, pool, method, target, body, lines, rid, send)


async def metrics(app: GatewayApp, scope: Scope, send: Send) -> None:
    token = app.metrics_auth
    if token is not None and not hmac.compare_digest(
        header(scope, b"authorization") or b"", token
    ):  # a scraper's own token (gateway.metrics_token_env), never an API key
        await respond(send, 401, _NO_METRICS_TOKEN)
    else:
        await respond(send, 200, app.metrics.render(), b"", b"text/plain; version=0.0.4")


async def refuse_websocket(scope: Scope, receive: Receive, send: Send) -> None:
    """The gateway proxies HTTP only: deny a WebSocket handshake with a JSON body when
    the server supports denial responses, else close it (policy violation)."""
    await receive()  # websocket.connect
    path = scope["path"]
    refusal = REFUSED.get(path)
    if refusal is not None:
        status, body = refusal.status, refusal.body("GET", path)
    else:
        status, body = 404, error_body(404, f"no route for WebSocket {path}")
    if "websocket.http.response" in scope.get("extensions", {}):
        await send({"type": "websocket.http.response.start", "status": status,
                    "headers": [JSON_HEADER, (b"content-length", b"%d" % len(body))]})
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1008})


async def ready(app: GatewayApp, send: Send) -> None:
    # A model with no awake replica whose activator says one starts or wakes on demand
    # (scaled to zero or asleep) is served: its requests are held, then answered. A
    # readiness probe or load balancer that took this gateway out for it would turn
    # the wake into the 503 that scale-from-zero exists to avoid (docs/scaling.md).
    # Asking starts nothing by itself: the autoscaler acts on held requests.
    missing: list[str] = []
    waking: list[str] = []
    for name, pool in app.state.pools.items():
        if not pool.any_routable():
            wakes = pool.activator is not None and pool.activator()
            (waking if wakes else missing).append(name)
    # A discovery source that has never listed knows no replica at all (later errors
    # keep its last list in force, so only the first one gates readiness).
    st = app.discovery.status() if app.discovery is not None else None
    unready = bool(missing) or (st is not None and not st.synced)
    body: dict[str, Any] = {"status": "not ready" if unready else "ready"}
    if missing:
        body["models_without_replicas"] = missing
    if waking:
        body["models_waking_on_request"] = waking
    if st is not None:
        body["discovery"] = {"source": st.source, "synced": st.synced, "error": st.error}
    await respond(send, 503 if unready else 200, orjson.dumps(body))
