"""The ASGI application: OpenAI API surface, admission, routing and the streaming proxy.

Raw ASGI on purpose: the proxy path is a few hundred microseconds of Python per request
and a framework's request/response objects would be a large share of it.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import os
import re
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

from inferplane.gateway.accesslog import AccessLog
from inferplane.gateway.admission import BATCH, INTERACTIVE, QueueFull, QueueTimeout
from inferplane.gateway.backend import Backend, failure_text
from inferplane.gateway.config import GatewayConfig, ModelRoute
from inferplane.gateway.connections import Connections, ConnectionsCollector
from inferplane.gateway.errors import ClientError, error_body, sse_error_event
from inferplane.gateway.lora import AdapterHoldings, AdapterLoadError, AdapterRoute
from inferplane.gateway.metrics import GatewayMetrics
from inferplane.gateway.monitor import Monitor
from inferplane.gateway.names import UNKNOWN_MODEL
from inferplane.gateway.pool import NoReplica, Pool
from inferplane.gateway.refusals import key_refusal, send_redirect, wants_html
from inferplane.gateway.replica_header import HEADER as REPLICA_HEADER
from inferplane.gateway.replica_header import TOKEN_HEADER, ReplicaHeader
from inferplane.gateway.request import estimate_prompt_tokens, parse_body, prefix_key
from inferplane.gateway.reserve import output_reservation
from inferplane.gateway.responses_guard import guard_responses_body, stores_response
from inferplane.gateway.routes import (
    GENERATION_LIMITS,
    MODEL_PATHS,
    MODELS_PREFIX,
    REFUSED,
    RESPONSES_PATH,
    RESPONSES_PREFIX,
    ResponseOwners,
    model_not_found,
    response_not_found,
    split_response_path,
)
from inferplane.gateway.scorers import RouteContext
from inferplane.gateway.state import GatewayState
from inferplane.gateway.stream_errors import InbandError
from inferplane.gateway.tracing import RequestTrace, Tracing, tracing_for
from inferplane.gateway.upstream import (
    Connection,
    UpstreamBodyError,
    UpstreamClient,
    UpstreamError,
)

if TYPE_CHECKING:
    from inferplane.console import ConsoleApp
    from inferplane.gateway.discovery import DiscoverySource
    from inferplane.tenancy.keys import KeyPolicy
    from inferplane.tenancy.service import Admission, Tenancy
    from inferplane.tenancy.streams import UsageStripper

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
_RESPONSES_TOKEN_EVENT = b"event: response.output_text.delta\n"

_JSON = (b"content-type", b"application/json")
_NO_METRICS_TOKEN = error_body(401, "metrics need the scrape token: 'Authorization: Bearer ...'")
_USAGE_PROMPT = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_USAGE_COMPLETION = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
# The Responses API (and Anthropic-style bodies) name them input/output tokens.
_USAGE_INPUT = re.compile(rb'"input_tokens"\s*:\s*(\d+)')
_USAGE_OUTPUT = re.compile(rb'"output_tokens"\s*:\s*(\d+)')


def usage_from(data: bytes) -> tuple[int, int]:
    """(prompt, completion) tokens from the last `"usage"` object in a body or stream tail:
    `prompt_tokens`/`completion_tokens`, or the Responses API's `input_tokens`/`output_tokens`."""
    at = data.rfind(b'"usage"')
    if at < 0:
        return 0, 0
    tail = data[at:]
    p = _USAGE_PROMPT.search(tail) or _USAGE_INPUT.search(tail)
    c = _USAGE_COMPLETION.search(tail) or _USAGE_OUTPUT.search(tail)
    return (int(p.group(1)) if p else 0, int(c.group(1)) if c else 0)


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


class _Record:
    """What one request did; filled in as it goes so a cancelled request still logs."""

    __slots__ = (
        "adapter",
        "admitted_s",
        "backend",
        "completion_tokens",
        "disconnected",
        "events",
        "finished",
        "headers",
        "keeps_response",
        "key_id",
        "prompt_tokens",
        "queue_wait",
        "retries",
        "sent",
        "show_replica",
        "started",
        "status",
        "stripper",
        "trace",
        "trace_headers",
        "ttft",
        "usage_known",
    )

    def __init__(self) -> None:
        self.backend: Backend | None = None
        self.adapter: str | None = None  # the LoRA adapter it runs with (its engine name)
        self.headers: Sequence[tuple[bytes, bytes]] = ()  # tenancy's x-ratelimit-* headers
        self.key_id: str | None = None  # the API key that made the request (tenancy)
        self.keeps_response = False  # a /v1/responses call vLLM stores: remember its id
        self.show_replica = False  # answer with x-inferplane-replica (replica_header)
        self.stripper: UsageStripper | None = None  # drops the usage event tenancy asked for
        self.status = 0
        self.ttft = 0.0
        self.queue_wait = 0.0
        self.admitted_s = 0.0  # received -> admitted (keys, limits, model resolved)
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.retries = 0
        self.sent = False  # the request went to a replica (its prompt was processed)
        self.events = 0  # SSE events relayed that carry tokens (billing of cut streams)
        self.usage_known = False  # the engine reported the request's usage
        self.started = False  # response headers sent to the client
        self.finished = False  # final body message being sent: a disconnect is normal now
        self.disconnected = False
        self.trace: RequestTrace | None = None  # tracing on: this request's spans
        self.trace_headers = b""  # tracing off: the client's traceparent/tracestate lines


async def _watch_disconnect(receive: Receive, task: asyncio.Task[Any], rec: _Record) -> None:
    # After the request body, receive() only returns when the client goes away (or, with
    # uvicorn, once the response is complete; `finished` tells the two apart).
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if not rec.finished:
                rec.disconnected = True
                task.cancel()
            return


class GatewayApp:
    """The gateway as an ASGI application. Build with `build_app(config)`; change
    replicas at run time through `app.state` (a `GatewayState`)."""

    def __init__(self, config: GatewayConfig, tenancy: Tenancy | None = None) -> None:
        self.config = config
        self.tenancy = tenancy  # keys, limits, usage ledger, DB routes (inferplane.tenancy)
        self.metrics = GatewayMetrics(self._live_series)
        self.state = GatewayState(config, on_unusable=self._count_unusable)
        self.access_log = AccessLog(config.access_log_path) if config.access_log else None
        self.connections = Connections(config.connections)  # client connection bounds
        self.metrics.registry.register(ConnectionsCollector(self.connections))
        self._session: aiohttp.ClientSession | None = None
        self.monitor = Monitor(
            self.state,
            self.session,
            config.engine_metrics_interval_s,
            config.health_interval_s,
        )
        self.monitor.on_hung = self._hung  # active health: a replica that stopped answering
        # LoRA: which replica holds which adapter, loads on demand (gateway/lora.py)
        self.adapters = AdapterHoldings(self.state, self.session, config.health_interval_s)
        self._rid_prefix = os.urandom(4).hex() + "-"
        self._rid_seq = itertools.count(1)
        self._priority_header = config.priority_header.lower().encode()
        self._metrics_auth = (
            b"Bearer " + config.metrics_token.encode() if config.metrics_token else None
        )
        self._upstream = UpstreamClient()
        # OpenTelemetry spans (gateway.tracing or OTEL_* variables); None: no span objects.
        self.tracing: Tracing | None = tracing_for(config.tracing)
        self._models_created = int(time.time())
        self.responses = ResponseOwners()  # response id -> replica, for /v1/responses/{id}
        self.replica_header = ReplicaHeader(config.expose_replica_header)
        self._probes: set[asyncio.Task[None]] = set()  # health checks after a total timeout
        self._started = False
        self.console: ConsoleApp | None = None  # the web console at /ui (console.attach)
        # Replicas found at run time (gateway.discovery: Kubernetes EndpointSlices).
        self.discovery: DiscoverySource | None = None
        if tenancy is not None:
            tenancy.register_metrics(self.metrics.registry)

    # ---- lifecycle -------------------------------------------------------------------

    def session(self) -> aiohttp.ClientSession:
        """aiohttp for the monitor's probes (cold path); proxying uses `UpstreamClient`."""
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
            )
        return self._session

    async def startup(self) -> None:
        if self._started:
            return
        self._started = True
        self.session()
        if self.tenancy is not None:
            await self.tenancy.start(self.state)
        self.monitor.start()
        self.adapters.start()
        if self.access_log is not None:
            self.access_log.start()
        if self.discovery is not None:
            from inferplane.gateway.discovery.sink import StateSink

            await self.discovery.start(StateSink(self.state))

    async def shutdown(self) -> None:
        if self.console is not None:
            await self.console.stop()
        if self.discovery is not None:
            await self.discovery.stop()
        await self.monitor.stop()
        await self.adapters.stop()
        if self.tenancy is not None:
            await self.tenancy.stop()
        if self.access_log is not None:
            await self.access_log.stop()
        if self._session is not None:
            await self._session.close()
            self._session = None
        self._upstream.close()
        self.connections.close()
        if self.tracing is not None:
            self.tracing.shutdown()
        self._started = False

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.startup()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    # ---- dispatch --------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            path = scope["path"]
            method = scope["method"]
            if path in MODEL_PATHS:
                if method == "POST":
                    if not self._started:
                        await self.startup()  # embedded without lifespan events
                    if self.tracing is None:
                        await self._proxy(scope, receive, send, path)
                    else:
                        await self.tracing.serve(self._proxy, scope, receive, send, path)
                else:
                    await self._respond(send, 405, error_body(405, "use POST"), b"")
            elif method == "GET" and path == "/v1/models":
                await self._models(scope, send, None)
            elif path.startswith(MODELS_PREFIX):
                if method == "GET":
                    await self._models(scope, send, path[len(MODELS_PREFIX) :])
                else:
                    await self._respond(send, 405, error_body(405, "use GET"), b"")
            elif path.startswith(RESPONSES_PREFIX):
                await self._response_by_id(scope, receive, send, path)
            elif method == "GET" and path == "/health":
                await self._respond(send, 200, b'{"status":"ok"}', b"")
            elif method == "GET" and path == "/ready":
                await self._ready(send)
            elif path == "/ui" or path.startswith("/ui/"):
                if self.console is None:
                    message = "the web console is off (gateway.console: false, or up --no-console)"
                    await self._respond(send, 404, error_body(404, message), b"")
                else:
                    await self.console(scope, receive, send)
            elif path.startswith("/admin/") and self.tenancy is not None:
                from inferplane.tenancy.admin import handle

                await handle(self.tenancy, scope, receive, send)
            elif method == "GET" and path == "/metrics":
                if self._metrics_auth is not None and not hmac.compare_digest(
                    _header(scope, b"authorization") or b"", self._metrics_auth
                ):  # a scraper's own token (gateway.metrics_token_env), never an API key
                    await self._respond(send, 401, _NO_METRICS_TOKEN, b"")
                else:
                    await self._respond(
                        send, 200, self.metrics.render(), b"", b"text/plain; version=0.0.4"
                    )
            elif path in REFUSED:  # vLLM routes the gateway does not serve, and why
                await self._respond(send, REFUSED[path].status,
                                    REFUSED[path].body(method, path), b"")
            elif path == "/" and method == "GET" and self.console is not None and wants_html(
                    _header(scope, b"accept")):
                await send_redirect(send, "/ui")  # a browser at the root: the console
            else:
                await self._respond(
                    send, 404, error_body(404, f"no route for {method} {path}"), b""
                )
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "websocket":
            await self._refuse_websocket(scope, receive, send)

    @staticmethod
    async def _respond(
        send: Send,
        status: int,
        body: bytes,
        rid: bytes,
        content_type: bytes = b"application/json",
        extra: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        headers = [(b"content-type", content_type), (b"content-length", b"%d" % len(body))]
        if rid:
            headers.append((b"x-request-id", rid))
        if extra:
            headers.extend(extra)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _caller_key(self, scope: Scope) -> tuple[bool, KeyPolicy | None]:
        """(allowed, key) for the gateway's own GET routes: as OpenAI and `vllm serve
        --api-key`, a valid, unexpired key is needed when auth is on."""
        tenancy = self.tenancy
        if tenancy is None:
            return True, None
        policy = tenancy.authenticate(_header(scope, b"authorization"))
        if policy is not None and policy.expires_at is not None and (
            policy.expires_at <= tenancy.clock()
        ):
            policy = None
        return policy is not None or not tenancy.auth_required, policy

    async def _models(self, scope: Scope, send: Send, model_id: str | None) -> None:
        """`GET /v1/models` and `GET /v1/models/{id}` (vLLM has only the list): the names a
        client can address, less those the caller's key may not use."""
        allowed, policy = self._caller_key(scope)
        if not allowed:
            await self._respond(send, 401, key_refusal(_header(scope, b"authorization")), b"")
            return
        names = self.state.client_names()
        if policy is not None and policy.allowed_models is not None:
            names = [name for name in names if name in policy.allowed_models]
        created = self._models_created
        if model_id is None:
            data = [self._model_card(name, created) for name in names]
            await self._respond(send, 200, orjson.dumps({"object": "list", "data": data}), b"")
        elif model_id in names:
            card = self._model_card(model_id, created)
            await self._respond(send, 200, orjson.dumps(card), b"")
        else:  # unknown and not-for-this-key look the same: no existence leak
            await self._respond(send, 404, model_not_found(model_id), b"")

    def _model_card(self, name: str, created: int) -> dict[str, Any]:
        card: dict[str, Any] = {"id": name, "object": "model", "created": created,
                                "owned_by": "inferplane"}  # fmt: skip
        parent = self.state.parent_of(name)
        if parent is not None:  # a LoRA adapter: its base model, as vLLM lists it
            card["parent"] = parent
        return card

    async def _response_by_id(
        self, scope: Scope, receive: Receive, send: Send, path: str
    ) -> None:
        """`GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel`: to the replica
        that made the response (`self.responses`), for the key that made it."""
        method = scope["method"]
        parsed = split_response_path(path)
        if parsed is None:
            await self._respond(send, 404, error_body(404, f"no route for {method} {path}"), b"")
            return
        response_id, action = parsed
        want = "POST" if action else "GET"
        if method != want:
            await self._respond(send, 405, error_body(405, f"use {want}"), b"")
            return
        allowed, policy = self._caller_key(scope)
        if not allowed:
            await self._respond(send, 401, key_refusal(_header(scope, b"authorization")), b"")
            return
        key_id = policy.id if policy is not None else None
        rid = (self._rid_prefix + str(next(self._rid_seq))).encode()
        owner = self.responses.get(response_id)
        pool = self.state.pools.get(owner.model) if owner is not None else None
        backend = None
        if owner is not None and pool is not None and owner.key_id in (None, key_id):
            backend = next((b for b in pool.backends if b.url == owner.url), None)
        if owner is None or pool is None or backend is None:  # unknown, lost, or not yours
            await self._respond(send, 404, response_not_found(response_id), rid)
            return
        try:
            body = await self._read_body(receive, _header(scope, b"content-length"))
        except ClientError as exc:
            await self._respond(send, exc.status, error_body(exc.status, exc.message), rid)
            return
        headers = {"X-Request-ID": rid.decode("latin-1")}
        auth = _header(scope, b"authorization")
        if backend.api_key:
            headers["Authorization"] = "Bearer " + backend.api_key
        elif key_id is None and auth is not None:
            headers["Authorization"] = auth.decode("latin-1")  # no gateway key: the engine's
        query = scope.get("query_string", b"")
        url = backend.url + path + ("?" + query.decode("latin-1") if query else "")
        timeouts = pool.route.timeouts
        timeout = aiohttp.ClientTimeout(total=timeouts.total_s, connect=timeouts.connect_s)
        started = False
        try:
            async with self.session().request(
                method, url, data=body or None, headers=headers, timeout=timeout
            ) as resp:
                ctype = resp.headers.get("Content-Type", "application/json").encode("latin-1")
                if not ctype.startswith(b"text/event-stream"):
                    payload = await resp.read()
                    await self._respond(send, resp.status, payload, rid, ctype)
                    return
                await send({"type": "http.response.start", "status": resp.status, "headers": [
                    (b"content-type", ctype), (b"cache-control", b"no-cache"),
                    (b"x-request-id", rid)]})  # fmt: skip
                started = True
                async for chunk in resp.content.iter_any():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
        except (aiohttp.ClientError, TimeoutError) as exc:
            message = f"{backend.public} failed to answer {method} {path}: "
            message += failure_text(exc, backend)
            if started:
                await send({"type": "http.response.body", "body": sse_error_event(502, message)})
            else:
                await self._respond(send, 502, error_body(502, message), rid)

    async def _refuse_websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
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
                        "headers": [_JSON, (b"content-length", b"%d" % len(body))]})
            await send({"type": "websocket.http.response.body", "body": body})
        else:
            await send({"type": "websocket.close", "code": 1008})

    async def _ready(self, send: Send) -> None:
        # A model with no awake replica whose activator says one starts or wakes on demand
        # (scaled to zero or asleep) is served: its requests are held, then answered. A
        # readiness probe or load balancer that took this gateway out for it would turn
        # the wake into the 503 that scale-from-zero exists to avoid (docs/scaling.md).
        # Asking starts nothing by itself: the autoscaler acts on held requests.
        missing: list[str] = []
        waking: list[str] = []
        for name, pool in self.state.pools.items():
            if not pool.any_routable():
                wakes = pool.activator is not None and pool.activator()
                (waking if wakes else missing).append(name)
        # A discovery source that has never listed knows no replica at all (later errors
        # keep its last list in force, so only the first one gates readiness).
        st = self.discovery.status() if self.discovery is not None else None
        unready = bool(missing) or (st is not None and not st.synced)
        body: dict[str, Any] = {"status": "not ready" if unready else "ready"}
        if missing:
            body["models_without_replicas"] = missing
        if waking:
            body["models_waking_on_request"] = waking
        if st is not None:
            body["discovery"] = {"source": st.source, "synced": st.synced, "error": st.error}
        await self._respond(send, 503 if unready else 200, orjson.dumps(body), b"")

    def _live_series(self) -> Iterator[tuple[str, str, int, int]]:
        for name, pool in self.state.pools.items():
            depth = len(pool.queue)
            if not pool.backends:
                yield name, "-", 0, depth
            for b in pool.backends:
                yield name, b.label, b.outstanding, depth

    def end_in_flight(self, url: str, reason: str) -> int:
        """End every request in flight to the replica at `url` now (streams get the final
        SSE error event naming `reason`), e.g. before a hung engine is killed."""
        return self._upstream.abort(url.rstrip("/"), reason)

    def _count_unusable(self, backend: Backend, reason: str) -> None:
        self.metrics.engine_unusable.labels(backend.label, reason).inc()

    # ---- the proxy path ----------------------------------------------------------------

    async def _proxy(
        self, scope: Scope, receive: Receive, send: Send, path: str,
        trace: RequestTrace | None = None,
    ) -> None:  # fmt: skip
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        rid: bytes | None = None
        trace_headers = b""
        priority = INTERACTIVE
        auth: bytes | None = None
        length: bytes | None = None
        priority_header = self._priority_header
        show_replica = self.replica_header.always
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = value
            elif name == b"x-request-id":
                rid = value if 0 < len(value) <= 128 else None
            elif name == b"authorization":
                auth = value
            elif name == priority_header:
                priority = BATCH if value.lower() == b"batch" else INTERACTIVE
            elif (name == b"traceparent" or name == b"tracestate") and trace is None:
                trace_headers += name + b": " + value + b"\r\n"  # passed on unchanged
            elif name == TOKEN_HEADER:
                show_replica = show_replica or self.replica_header.granted(value)
        if rid is None:
            rid = (self._rid_prefix + str(next(self._rid_seq))).encode()

        try:
            body = await self._read_body(receive, length)
            data = parse_body(body, path)
        except ClientError as exc:
            await self._reject(send, exc.status, exc.message, rid, "-", exc.param)
            return
        model = data["model"]
        stream = data.get("stream") is True
        adm: Admission | None = None
        est = 0  # what tenancy charged at admission: prompt estimate + output reservation
        prompt_est = 0
        tenancy = self.tenancy
        if tenancy is not None:
            prompt_est = estimate_prompt_tokens(body)
            out = output_reservation(data, path, self.state.max_tokens_cap(model))
            est = prompt_est + out
            if tenancy.sync_limits:
                verdict = tenancy.admit_now(auth, model, est, out)
            else:
                verdict = await tenancy.admit(auth, model, est, out)
            if not hasattr(verdict, "lease"):  # a Rejection (401/403/429)
                await self._respond(
                    send, verdict.status, verdict.body(), rid, extra=verdict.headers
                )
                self.metrics.series(self._served_name(model), "-").count(verdict.status)
                return
            admitted: Admission = verdict  # type: ignore[assignment]  # not a Rejection
            if admitted.key_id is not None:
                auth = None  # the gateway's key is not the engine's business
            if admitted.batch:
                priority = BATCH
            adm = admitted
        if adm is not None and adm.route_to is not None:
            picked = self.state.target(adm.route_to)
        else:
            picked = self.state.pick(model)
        pool, adapter = picked if picked is not None else (None, None)
        if pool is None:
            self._tenancy_done(adm, est, rid, UNKNOWN_MODEL, _Record(), 404, 0.0, stream)
            # the one shape of an unknown model, as GET /v1/models/{id} answers it (OpenAI's)
            await self._reject(send, 404, "", rid, "-", None, requested=model,
                               body=model_not_found(model))
            return
        lane = pool.route.long_prompt_lane
        if lane is not None and adapter is None and (
            estimate_prompt_tokens(body) > lane.threshold_tokens
        ):  # (an adapter stays on its base: the lane's model does not serve it)
            pool = self.state.pools[lane.model]
        route = pool.route
        served = adapter.name if adapter is not None else route.name  # usage and metrics
        try:
            if path == RESPONSES_PATH and guard_responses_body(
                data, adm.key_id if adm is not None else None
            ):
                body = orjson.dumps(data)
            body = self._rewrite(data, body, model, route, path,
                                 adapter.name if adapter is not None else None)
        except ClientError as exc:
            self._tenancy_done(adm, est, rid, served, _Record(), exc.status, 0.0, stream)
            await self._reject(send, exc.status, exc.message, rid, served, exc.param)
            return

        ctx = RouteContext(
            prefix_key(data, route.prefix_chars) if pool.uses_prefix else None,
            _header(scope, pool.session_header) if pool.uses_session else None,
            t0,
            self.adapters.holders(adapter.name) if adapter is not None else None,
            self.adapters.warm(adapter.name) if adapter is not None else None,
        )
        rec = _Record()
        rec.keeps_response = path == RESPONSES_PATH and stores_response(data)
        rec.show_replica = show_replica
        rec.trace_headers = trace_headers
        rec.admitted_s = loop.time() - t0
        if trace is not None:
            rec.trace = trace
            trace.admitted(t0 + rec.admitted_s, served)
        if adm is not None:
            rec.headers = adm.headers
            rec.key_id = adm.key_id
            if stream and path in _GENERATION_PATHS:
                from inferplane.tenancy.streams import UsageStripper, ask_for_usage

                if ask_for_usage(data):  # the ledger needs the stream's tokens
                    body = orjson.dumps(data)
                    rec.stripper = UsageStripper()
        others: list[Backend] = []
        previous = data.get("previous_response_id") if path == RESPONSES_PATH else None
        if previous is not None:
            # vLLM keeps the earlier turn in the memory of the replica that made it.
            owner = self.responses.get(previous) if type(previous) is str else None
            if owner is None or owner.model != route.name or owner.key_id not in (
                None, rec.key_id
            ):  # unknown, another model's, or another key's: as vLLM answers a lost id
                self._tenancy_done(adm, est, rid, served, _Record(), 404, 0.0, stream)
                self.metrics.series(served, "-").count(404)
                await self._respond(send, 404, response_not_found(str(previous)), rid)
                return
            others = [b for b in pool.backends if b.url != owner.url]
        task = asyncio.current_task()
        assert task is not None
        watcher = loop.create_task(_watch_disconnect(receive, task, rec))
        try:
            # A continuation goes to the replica holding its previous response when that
            # one has a free slot; otherwise it is balanced as usual (and that replica
            # answers vLLM's 404 for the id it does not hold).
            backend = pool.try_acquire(ctx, exclude=others) if others else None
            if backend is None:
                backend = pool.try_acquire(ctx)
            if backend is None:
                if trace is not None:
                    trace.queued(loop.time())
                backend = await self._admit(pool, ctx, priority, send, rid, rec)
                if backend is None:
                    return
            rec.backend = backend
            if adapter is not None and not await self._adapter_ready(pool, adapter, rec, send,
                                                                     rid):
                return
            rec.queue_wait = loop.time() - t0
            if trace is not None:
                trace.routed(t0 + rec.queue_wait)
            await self._forward(pool, path, body, stream, rid, auth, rec, send)
        except asyncio.CancelledError:
            if not rec.disconnected:
                raise
            task.uncancel()
            rec.status = 499  # client closed the request; the upstream was cancelled
        finally:
            rec.finished = True
            if not watcher.done():
                watcher.cancel()
            if rec.backend is not None:
                pool.release(rec.backend)
            if not rec.usage_known and (
                rec.started or (rec.sent and rec.status in (499, 504))
            ):
                # Cut short (client gone, engine died, timed out) before the engine's usage
                # arrived: bill what it consumed, the prompt (estimated) and every token
                # event streamed, so an aborted request never comes for free.
                rec.prompt_tokens = prompt_est or estimate_prompt_tokens(body)
                rec.completion_tokens = max(rec.events, 0)
            total = loop.time() - t0
            self._account(route, rec, total, rid, served)
            if trace is not None:
                trace.finish(
                    t0 + total, rid.decode("latin-1"),
                    rec.backend.label if rec.backend is not None else "-", rec.status,
                    rec.ttft, stream, rec.retries, rec.prompt_tokens, rec.completion_tokens,
                )  # fmt: skip
            if adm is not None:
                self._tenancy_done(adm, est, rid, served, rec, rec.status, total, stream)

    async def _read_body(self, receive: Receive, length: bytes | None) -> bytes:
        limit = self.config.max_body_bytes
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                raise ClientError(400, "Content-Length is not a number") from None
            if declared > limit:
                raise ClientError(413, self._too_large())
        message = await receive()
        body: bytes = message.get("body", b"")
        if not message.get("more_body", False):
            if len(body) > limit:
                raise ClientError(413, self._too_large())
            return body
        chunks = [body]
        size = len(body)
        while message.get("more_body", False):
            message = await receive()
            if message["type"] != "http.request":
                raise ClientError(400, "client closed the connection while sending the body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise ClientError(413, self._too_large())
            chunks.append(chunk)
        return b"".join(chunks)

    def _too_large(self) -> str:
        limit = self.config.max_body_bytes
        return f"request body exceeds the gateway limit of {limit} bytes ({limit / 2**20:g} MiB)"

    @staticmethod
    def _rewrite(
        data: dict[str, Any], body: bytes, model: str, route: ModelRoute, path: str,
        adapter: str | None = None,
    ) -> bytes:
        """Apply the served-name map (an adapter's: its engine name) and the max_tokens
        cap; re-encode only when needed."""
        changed = False
        upstream = adapter if adapter is not None else route.upstream_name
        if upstream != model:
            data["model"] = upstream
            changed = True
        cap = route.max_tokens_cap
        keys = GENERATION_LIMITS.get(path)
        if cap is not None and keys is not None:
            present = False
            for key in keys:
                value = data.get(key)
                if value is None:
                    continue
                if type(value) is not int:  # parse_body checks max_tokens, not the others
                    raise ClientError(400, f"'{key}' must be an integer", key)
                present = True
                if value > cap:
                    if route.max_tokens_mode == "reject":
                        raise ClientError(
                            400, f"'{key}' is {value}, above this model's cap of {cap}", key
                        )
                    data[key] = cap
                    changed = True
            if not present:
                data[keys[0]] = cap
                changed = True
        return orjson.dumps(data) if changed else body

    async def _adapter_ready(
        self, pool: Pool, adapter: AdapterRoute, rec: _Record, send: Send, rid: bytes
    ) -> bool:
        """Make sure the chosen replica holds the adapter (loading it there, bounded by
        the model's queue wait); else answer 503 and say why."""
        backend = rec.backend
        assert backend is not None
        try:
            await self.adapters.ensure(backend, adapter, pool.route.admission.max_queue_wait_s)
            self.adapters.served(backend.url, adapter.name, pool.route.adapter_cache_slots)
            rec.adapter = adapter.name
            return True
        except AdapterLoadError as exc:
            rec.status = 503
            rec.finished = True
            retry = [(b"retry-after", str(pool.route.admission.retry_after_s).encode())]
            await self._respond(send, 503, error_body(503, str(exc)), rid, extra=retry)
            return False

    async def _admit(
        self, pool: Pool, ctx: RouteContext, priority: int, send: Send, rid: bytes, rec: _Record
    ) -> Backend | None:
        route = pool.route
        retry_after = [(b"retry-after", str(route.admission.retry_after_s).encode())]
        try:
            return await pool.acquire(ctx, priority)
        except NoReplica:
            message = f"no ready replica for model `{route.name}`; retry later"
            status = 503
        except QueueFull:
            message = f"queue for model `{route.name}` is full; retry later"
            status = 429
        except QueueTimeout:
            wait = route.admission.max_queue_wait_s
            if pool.activator is not None and not pool.any_routable():
                # held for a wake or scale-from-zero, not for a busy replica's slot
                message = (f"model `{route.name}` did not wake within {wait:g} s "
                           "(no replica finished waking or starting); retry later")
            else:
                message = f"no replica of model `{route.name}` freed up within {wait:g} s"
            status = 503
        rec.status = status
        rec.finished = True
        await self._respond(send, status, error_body(status, message), rid, extra=retry_after)
        return None

    async def _forward(
        self,
        pool: Pool,
        path: str,
        body: bytes,
        stream: bool,
        rid: bytes,
        auth: bytes | None,
        rec: _Record,
        send: Send,
    ) -> None:
        loop = asyncio.get_running_loop()
        route = pool.route
        timeouts = route.timeouts
        upstream = self._upstream
        t_sent = loop.time()
        total_deadline = t_sent + timeouts.total_s
        # Non-streaming responses only start when generation ends: total bounds them.
        first_deadline = (
            min(t_sent + timeouts.first_token_s, total_deadline) if stream else total_deadline
        )
        backend = rec.backend
        assert backend is not None
        tried: list[Backend] = []
        # Replicas that answered this request with a 5xx before a retry. Whether that was
        # the replica's fault or the request's is only known from the next attempt: a
        # success elsewhere confirms it, a 5xx elsewhere makes it the request's own.
        suspects: list[Backend] = []
        try:
            async with asyncio.timeout_at(first_deadline) as deadline:
                while True:
                    if backend.api_key:
                        auth_line = b"Authorization: Bearer " + backend.api_key.encode() + b"\r\n"
                    elif auth is not None:
                        auth_line = b"Authorization: " + auth + b"\r\n"
                    else:
                        auth_line = b""
                    failure: str | None = None
                    error_payload: tuple[int, bytes, bytes] | None = None
                    rec.sent = True
                    trace_lines = (
                        rec.trace_headers if rec.trace is None
                        else rec.trace.upstream(t_sent, backend.label, backend.url)
                    )
                    try:
                        conn = await upstream.post(
                            backend.url,
                            path,
                            body,
                            b"X-Request-ID: " + rid + b"\r\n" + auth_line + trace_lines,
                            timeouts.connect_s,
                        )
                    except UpstreamError as exc:
                        failure = f"{backend.public} unreachable: {exc}"
                        self._gateway_failure(pool, backend, failure)
                    else:
                        if conn.status >= 500 and len(tried) < route.retries:
                            try:
                                payload = await conn.read_all()
                            except UpstreamBodyError:
                                payload = b""
                            finally:
                                conn.release()
                            failure = f"{backend.public} answered {conn.status}"
                            error_payload = (conn.status, payload, conn.content_type)
                            suspects.append(backend)
                    if failure is None:
                        break
                    tried.append(backend)
                    retry_ctx = RouteContext(now=loop.time())
                    if rec.adapter is not None:  # prefer the others holding its adapter
                        retry_ctx.holders = self.adapters.holders(rec.adapter)
                        retry_ctx.warm = self.adapters.warm(rec.adapter)
                    nxt = pool.try_acquire(retry_ctx, exclude=tried)
                    if nxt is not None and rec.adapter is not None and not (
                        self.adapters.holds(nxt.url, rec.adapter)
                    ):  # a LoRA request is retried only where its adapter is loaded
                        pool.release(nxt)
                        nxt = None
                    if nxt is None or len(tried) > route.retries:
                        if nxt is not None:
                            pool.release(nxt)
                        if len(suspects) == 1 and error_payload is not None:
                            # Nowhere else to try it: an unconfirmed 5xx of this replica.
                            self._error_5xx(pool, suspects[0])
                        await self._upstream_failed(send, rid, rec, failure, error_payload)
                        return
                    pool.release(backend)
                    rec.backend = backend = nxt
                    rec.retries += 1
                    self.metrics.retries.labels(route.name).inc()

                status = conn.status
                rec.status = status
                if status < 500:
                    for suspect in suspects:  # confirmed: this request works elsewhere
                        self._error_5xx(pool, suspect)
                elif not suspects:
                    self._error_5xx(pool, backend)  # unconfirmed (no other replica tried)
                # else: a 5xx on two replicas is the request's own; neither is counted.
                if stream and status == 200:
                    await self._relay_stream(
                        conn, send, rid, rec, deadline, t_sent, timeouts.idle_s,
                        total_deadline, pool, path,
                    )  # fmt: skip
                    return
                try:
                    payload = await conn.read_all()
                except UpstreamBodyError as exc:
                    conn.close()
                    why = f"{backend.public} failed while responding: {exc}"
                    self._gateway_failure(pool, backend, why)
                    await self._upstream_failed(send, rid, rec, why, None)
                    return
                except BaseException:
                    conn.close()  # cancelled or timed out: drop the upstream connection
                    raise
                rec.ttft = loop.time() - t_sent
                conn.release()
                if status < 500:
                    backend.consecutive_failures = backend.consecutive_5xx = 0
                if status == 200:
                    rec.prompt_tokens, rec.completion_tokens = usage_from(payload)
                    rec.usage_known = True
                    if rec.keeps_response:
                        self.responses.learn(payload, route.name, backend.url, rec.key_id)
                rec.finished = True
                extra = rec.headers
                if rec.show_replica:
                    extra = (*extra, (REPLICA_HEADER, backend.label.encode()))
                await self._respond(
                    send, status, payload, rid, conn.content_type or _JSON[1], extra
                )
        except TimeoutError:
            message = f"upstream timed out (model `{route.name}`)"
            failed = rec.backend
            # Reaching `total_s` is the request's own deadline (a long generation), not the
            # replica's failure: a stream that kept making progress is long, not broken, and
            # a non-streaming answer counts only if the replica's /health fails too. A
            # first-byte or idle timeout is the replica's.
            if failed is not None:
                if loop.time() < total_deadline - 1e-3:
                    self._gateway_failure(pool, failed, f"{failed.public} timed out")
                elif not stream:
                    self._confirm_hung(pool, failed)
            rec.finished = True
            rec.status = 504
            if rec.started:  # mid-stream: end the stream with an error event
                await send({"type": "http.response.body", "body": sse_error_event(504, message)})
            else:
                await self._respond(send, 504, error_body(504, message), rid)

    async def _relay_stream(
        self,
        conn: Connection,
        send: Send,
        rid: bytes,
        rec: _Record,
        deadline: asyncio.Timeout,
        t_sent: float,
        idle_s: float,
        total_deadline: float,
        pool: Pool,
        path: str,
    ) -> None:
        """Pass SSE bytes through as they arrive; never buffer or re-frame events. Counts
        the events relayed, so a stream cut short is still billed for what it streamed."""
        loop = asyncio.get_running_loop()
        headers = [
            (b"content-type", conn.content_type or b"text/event-stream"),
            (b"cache-control", b"no-cache"),
            (b"x-request-id", rid),
            *rec.headers,
        ]
        if rec.show_replica:
            headers.append((REPLICA_HEADER, rec.backend.label.encode() if rec.backend else b"-"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        rec.started = True
        prev = last = b""
        backend = rec.backend
        assert backend is not None
        inband = InbandError()  # the engine's own error event (vLLM: its engine core died)
        try:
            chunk = await conn.read_chunk()
            rec.ttft = loop.time() - t_sent
            stripper = rec.stripper
            # Chat streams open with a role-only event that carries no token.
            rec.events = -1 if path == "/v1/chat/completions" and b'"role"' in chunk else 0
            marker = b"\n\n"  # one SSE event per blank line
            if path == RESPONSES_PATH:
                marker = _RESPONSES_TOKEN_EVENT  # its other events carry no token
            if rec.keeps_response:
                self.responses.learn(chunk, pool.route.name, backend.url, rec.key_id)
            while chunk:
                if stripper is not None:
                    chunk = stripper.feed(chunk)
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    rec.events += chunk.count(marker)
                    prev, last = last, chunk
                    if not inband.seen:
                        inband.feed(chunk)
                        if inband.seen and marker == b"\n\n":
                            rec.events -= 1  # the error event carries no token
                    else:
                        inband.feed(chunk)
                deadline.reschedule(min(loop.time() + idle_s, total_deadline))
                chunk = await conn.read_chunk()
            if stripper is not None:
                rest = stripper.flush()
                if rest:
                    await send({"type": "http.response.body", "body": rest, "more_body": True})
                    prev, last = last, rest
                    inband.feed(rest)
                prev, last = prev + last, stripper.usage
        except UpstreamBodyError as exc:
            conn.close()
            self._gateway_failure(pool, backend, f"{backend.public} failed mid-stream")
            rec.status = 502
            rec.finished = True
            # Close a half-sent event first so the error event parses on its own.
            tail = b"" if last.endswith(b"\n\n") or not last else b"\n\n"
            inband.finish()
            if inband.status is not None:  # the engine said why already: one error event
                rec.status = inband.status
                if not last.endswith(b"[DONE]\n\n"):
                    await send({"type": "http.response.body",
                                "body": tail + b"data: [DONE]\n\n"})  # fmt: skip
                else:
                    await send({"type": "http.response.body", "body": b""})
                return
            message = f"{backend.public} failed mid-stream: {exc}"
            await send({"type": "http.response.body", "body": tail + sse_error_event(502, message)})
            return
        except BaseException:
            conn.close()  # cancelled or timed out: drop the upstream connection
            raise
        conn.release()
        inband.finish()
        if inband.status is None:
            backend.consecutive_failures = backend.consecutive_5xx = 0
        else:  # a 200 that failed: counted by the engine's code, billed as a cut stream
            rec.status = inband.status
            if inband.status >= 500:
                self._gateway_failure(
                    pool, backend, f"{backend.public} ended a stream with an error: "
                    f"{inband.message}",
                )  # fmt: skip
        if last.endswith(b"[DONE]\n\n"):
            rec.events -= 1
        rec.prompt_tokens, rec.completion_tokens = usage_from(prev + last)
        rec.usage_known = rec.prompt_tokens > 0 or rec.completion_tokens > 0
        rec.finished = True
        await send({"type": "http.response.body", "body": b""})

    def _gateway_failure(self, pool: Pool, backend: Backend, why: str) -> None:
        """The replica's own failure (no connection, reset, death mid-stream, timeout):
        eject after `eject_after_failures` in a row, and end what is in flight on it."""
        backend.consecutive_failures += 1
        if backend.consecutive_failures >= pool.route.eject_after_failures:
            self._eject(pool, backend, why, keep_one=False)

    def _hung(self, pool: Pool, backend: Backend) -> None:
        """The monitor's /health probes got no answer: eject it, end its requests."""
        self._eject(pool, backend, f"{backend.public} stopped answering /health", keep_one=False)

    def _confirm_hung(self, pool: Pool, backend: Backend) -> None:
        """Count a total-deadline timeout as the replica's failure only once its /health
        fails too (probed in the background: the client has its 504 at once)."""

        async def probe() -> None:
            if not await self.monitor.alive(backend):
                self._gateway_failure(pool, backend, f"{backend.public} timed out")

        task = asyncio.get_running_loop().create_task(probe())
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    def _error_5xx(self, pool: Pool, backend: Backend) -> None:
        """A 5xx answer not shown to be the request's own: eject after `eject_after_5xx`
        in a row, but never the model's last routable replica."""
        backend.consecutive_5xx += 1
        if backend.consecutive_5xx >= pool.route.eject_after_5xx:
            why = f"{backend.consecutive_5xx} consecutive 5xx answers"
            self._eject(pool, backend, why, keep_one=True, end_in_flight=False)

    def _eject(
        self, pool: Pool, backend: Backend, why: str, *, keep_one: bool,
        end_in_flight: bool = True,
    ) -> None:  # fmt: skip
        """Passive health: stop routing to the replica until the monitor readmits it."""
        if backend.ejected:
            return
        if not pool.may_eject(backend, keep_one=keep_one):
            self.metrics.ejections_refused.labels(pool.route.name, backend.label).inc()
            return
        backend.ejected = True
        self.metrics.ejections.labels(pool.route.name, backend.label).inc()
        if end_in_flight:  # a hung or dying replica: its streams would only wait
            self._upstream.abort(backend.url, f"replica ejected ({why})")

    async def _upstream_failed(
        self,
        send: Send,
        rid: bytes,
        rec: _Record,
        message: str,
        payload: tuple[int, bytes, bytes] | None,
    ) -> None:
        rec.finished = True
        if payload is not None:  # out of retries: pass the engine's own 5xx through
            status, body, ctype = payload
            rec.status = status
            await self._respond(send, status, body, rid, ctype or _JSON[1])
        else:
            rec.status = 502
            await self._respond(send, 502, error_body(502, message), rid)

    async def _reject(
        self, send: Send, status: int, message: str, rid: bytes, model: str, param: str | None,
        requested: str | None = None, body: bytes | None = None,
    ) -> None:
        await self._respond(send, status, body or error_body(status, message, param), rid)
        self.metrics.series(model, "-").count(status)  # never the client's name: bounded labels
        if self.access_log is not None:
            record: dict[str, Any] = {
                "request_id": rid.decode("latin-1"), "received_at": round(time.time(), 6),
                "model": model, "status": status,
            }
            if requested is not None:  # what an unknown-model request asked for (trace)
                record["requested_model"] = requested[:256]
            self.access_log.write(record)

    def _served_name(self, model: str) -> str:
        """The name as a metrics label when the fleet serves it, else UNKNOWN_MODEL."""
        return model if self.state.serves(model) else UNKNOWN_MODEL

    def _account(
        self, route: ModelRoute, rec: _Record, total: float, rid: bytes, name: str | None = None
    ) -> None:
        """Metrics and the access log of a finished request; `name`: what it is counted
        as (an adapter's name, else the model's)."""
        name = name or route.name
        replica = rec.backend.label if rec.backend is not None else "-"
        series = self.metrics.series(name, replica)
        series.count(rec.status)
        series.duration.observe(total)
        if rec.ttft:
            series.ttft.observe(rec.ttft)
        self.metrics.observe_queue_wait(name, rec.queue_wait)
        if rec.prompt_tokens or rec.completion_tokens:
            self.metrics.add_tokens(name, rec.prompt_tokens, rec.completion_tokens)
        if self.access_log is not None:
            self.access_log.write(
                {
                    "request_id": rid.decode("latin-1"),
                    # when it arrived, so `inferplane trace` can put the phases on a clock
                    "received_at": round(time.time() - total, 6),
                    "model": name,
                    "replica": replica,
                    "replica_url": rec.backend.address if rec.backend is not None else "-",
                    "status": rec.status,
                    "prompt_tokens": rec.prompt_tokens,
                    "completion_tokens": rec.completion_tokens,
                    "admission_s": round(rec.admitted_s, 6),
                    "queue_wait_s": round(rec.queue_wait, 6),
                    "upstream_ttft_s": round(rec.ttft, 6),
                    "total_s": round(total, 6),
                    "retries": rec.retries,
                }
            )


    def _tenancy_done(
        self,
        adm: Admission | None,
        est: int,
        rid: bytes,
        model: str,
        rec: _Record,
        status: int,
        total: float,
        stream: bool,
    ) -> None:
        """Hand the finished request to tenancy: frees its limits, writes its usage row."""
        if adm is None or self.tenancy is None:
            return
        backend = rec.backend
        # A plain tuple in the ledger's column order (inferplane.tenancy.ledger.Usage):
        # ts, request_id, key_id, model, replica, prompt_tokens, completion_tokens, status,
        # stream, duration_s, ttft_s, queue_wait_s.
        self.tenancy.record(
            adm,
            (
                time.time(),
                rid.decode("latin-1"),
                adm.key_id,
                model,
                backend.label if backend is not None else "-",
                rec.prompt_tokens,
                rec.completion_tokens,
                status,
                stream,
                total,
                rec.ttft,
                rec.queue_wait,
            ),
            est,
        )


def build_app(config: GatewayConfig, tenancy: Tenancy | None = None) -> GatewayApp:
    """The gateway's ASGI application; `app.state` changes backends at run time.
    `tenancy` (optional) adds API keys, limits, the usage ledger and DB routes."""
    return GatewayApp(config, tenancy)
