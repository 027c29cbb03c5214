"""The ASGI application: dispatch, lifecycle, and the proxy path read top-down.

A model-addressed request goes through the stages in order, each its own module:

    accept   (accept.py)   headers in one pass, the body bounded, parsed (request.py)
    admit    (admit.py)    tenancy: API key, model allowed, limits
    route    (routing.py)  the name to a pool (state.resolve), the body for that replica,
                           a replica slot (queueing by priority)
    forward  (forward.py)  the one upstream client (upstream.py), retries, deadlines
    relay    (relay.py)    the answer back: one JSON body or SSE bytes as they arrive
    account  (account.py)  metrics, access log, tenancy's usage row and limits release

`Record` (record.py) is what each stage writes and accounting reads. Raw ASGI on purpose:
the proxy path is a few hundred microseconds of Python per request and a framework's
request/response objects would be a large share of it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterator
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

from inferplane.gateway import endpoints
from inferplane.gateway.accept import Acceptor
from inferplane.gateway.accesslog import AccessLog
from inferplane.gateway.account import Accounting, tenancy_done
from inferplane.gateway.admission import BATCH
from inferplane.gateway.admit import admit, reservation
from inferplane.gateway.asgi import NativeEntry, Receive, Scope, Send, find_header, respond
from inferplane.gateway.backend import Backend
from inferplane.gateway.config import GatewayConfig
from inferplane.gateway.connections import CONNECTION, Connections, ConnectionsCollector
from inferplane.gateway.errors import ClientError, error_body
from inferplane.gateway.forward import Forwarder
from inferplane.gateway.health import PassiveHealth
from inferplane.gateway.lora import AdapterHoldings
from inferplane.gateway.metrics import GatewayMetrics
from inferplane.gateway.monitor import Monitor
from inferplane.gateway.names import UNKNOWN_MODEL
from inferplane.gateway.pool import Pool
from inferplane.gateway.record import Record, usage_from, watch_disconnect
from inferplane.gateway.replica_header import ReplicaHeader
from inferplane.gateway.request import estimate_prompt_tokens, parse_body, prefix_key
from inferplane.gateway.responses_guard import guard_responses_body, stores_response
from inferplane.gateway.routes import (
    MODEL_PATHS,
    RESPONSES_PATH,
    ResponseOwners,
    model_not_found,
    response_not_found,
)
from inferplane.gateway.routing import acquire, adapter_ready, others_than_owner, pick_pool, rewrite
from inferplane.gateway.scorers import RouteContext
from inferplane.gateway.state import GatewayState
from inferplane.gateway.tracing import RequestTrace, Tracing, tracing_for
from inferplane.gateway.upstream import UpstreamClient

if TYPE_CHECKING:
    from inferplane.console import ConsoleApp
    from inferplane.gateway.discovery import DiscoverySource
    from inferplane.tenancy.service import Admission, Tenancy

__all__ = ["MODEL_PATHS", "GatewayApp", "build_app", "usage_from"]

_GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})


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
        self.metrics_auth = (
            b"Bearer " + config.metrics_token.encode() if config.metrics_token else None
        )
        self._upstream = UpstreamClient()
        self.health = PassiveHealth(self.metrics, self._upstream, self.monitor)
        self.forwarder = Forwarder(self._upstream, self.health, self.metrics, self.adapters)
        self.accounting = Accounting(self.metrics, self.access_log)
        self.replica_header = ReplicaHeader(config.expose_replica_header)
        self.acceptor = Acceptor(config.priority_header, self.replica_header, config.max_body_bytes)
        # OpenTelemetry spans (gateway.tracing or OTEL_* variables); None: no span objects.
        self.tracing: Tracing | None = tracing_for(config.tracing)
        self.models_created = int(time.time())
        self.responses = ResponseOwners()  # response id -> replica, for /v1/responses/{id}
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
            if path in MODEL_PATHS and scope["method"] == "POST":
                if not self._started:
                    await self.startup()  # embedded without lifespan events
                if self.tracing is None:
                    await self._proxy(scope, receive, send, path)
                else:
                    await self.tracing.serve(self._proxy, scope, receive, send, path)
            else:
                await endpoints.dispatch(self, scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "websocket":
            await endpoints.refuse_websocket(scope, receive, send)

    def native_entry(self) -> NativeEntry | None:
        """The proxy for the gateway's own protocol (`h1.py`), scope-free; None with
        tracing, whose spans read the scope. Its server ran the lifespan: started."""
        return self._serve if self.tracing is None else None

    # ---- hooks for the runtime, the monitor and the console ----------------------------

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

    def _hung(self, pool: Pool, backend: Backend) -> None:
        self.health.hung(pool, backend)

    # ---- the proxy path: accept -> admit -> route -> forward/relay -> account ----------

    def _proxy(
        self, scope: Scope, receive: Receive, send: Send, path: str,
        trace: RequestTrace | None = None,
    ) -> Awaitable[None]:  # fmt: skip
        return self._serve(path, scope["headers"], receive, send, scope.get(CONNECTION), trace)

    async def _serve(
        self, path: str, headers: list[tuple[bytes, bytes]], receive: Receive, send: Send,
        guarded: Any, trace: RequestTrace | None = None,
    ) -> None:  # fmt: skip
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        # accept
        head = self.acceptor.head(headers, trace is not None)
        rid = head.rid
        auth = head.auth
        priority = head.priority
        try:
            body = await self.acceptor.body(receive, head.length)
            data = parse_body(body, path)
        except ClientError as exc:
            await respond(send, exc.status, error_body(exc.status, exc.message, exc.param), rid)
            self.accounting.refused(rid, UNKNOWN_MODEL, exc.status)
            return
        model = data["model"]
        stream = data.get("stream") is True

        # admit
        adm: Admission | None = None
        est = 0  # what tenancy charged at admission: prompt estimate + output reservation
        prompt_est = 0
        tenancy = self.tenancy
        if tenancy is not None:
            need = reservation(self.state, model, data, body, path)
            est, prompt_est = need.total, need.prompt_estimate
            if tenancy.sync_limits:  # limits in memory: no await, no coroutine
                decision = tenancy.admit_now(auth, model, est, need.output)
            else:
                decision = await admit(tenancy, auth, model, need)
            if not hasattr(decision, "lease"):  # a Rejection (401/403/429)
                await respond(send, decision.status, decision.body(), rid,
                              extra=decision.headers)  # fmt: skip
                served = model if self.state.serves(model) else UNKNOWN_MODEL
                self.metrics.series(served, "-").count(decision.status)
                return
            adm = decision  # type: ignore[assignment]  # not a Rejection
            assert adm is not None
            if adm.key_id is not None:
                auth = None  # the gateway's key is not the engine's business
            if adm.batch:
                priority = BATCH
        key_id = adm.key_id if adm is not None else None

        # route: the pool, then the body as its replicas must see it
        picked = pick_pool(self.state, model, key_id, body)
        if picked is None:
            tenancy_done(tenancy, adm, est, rid, UNKNOWN_MODEL, Record(), 404, 0.0, stream)
            # the one shape of an unknown model, as GET /v1/models/{id} answers it (OpenAI's)
            await respond(send, 404, model_not_found(model), rid)
            self.accounting.refused(rid, UNKNOWN_MODEL, 404, requested=model)
            return
        pool, adapter = picked
        route = pool.route
        served = adapter.name if adapter is not None else route.name  # usage and metrics
        try:
            if path == RESPONSES_PATH and guard_responses_body(data, key_id):
                body = orjson.dumps(data)
            body = rewrite(data, body, model, route, path,
                           adapter.name if adapter is not None else None)  # fmt: skip
        except ClientError as exc:
            tenancy_done(tenancy, adm, est, rid, served, Record(), exc.status, 0.0, stream)
            await respond(send, exc.status, error_body(exc.status, exc.message, exc.param), rid)
            self.accounting.refused(rid, served, exc.status)
            return
        ctx = RouteContext(
            prefix_key(data, route.prefix_chars) if pool.uses_prefix else None,
            find_header(headers, pool.session_header) if pool.uses_session else None,
            t0,
        )
        if adapter is not None:  # prefer the replicas holding it (gateway/lora.py)
            ctx.holders = self.adapters.holders(adapter.name)
            ctx.warm = self.adapters.warm(adapter.name)
        rec = Record()
        rec.keeps_response = path == RESPONSES_PATH and stores_response(data)
        rec.show_replica = head.show_replica
        rec.trace_headers = head.trace_headers
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
            found = others_than_owner(self.responses, previous, pool, rec.key_id)
            if found is None:  # unknown, another model's, or another key's id
                tenancy_done(tenancy, adm, est, rid, served, Record(), 404, 0.0, stream)
                self.metrics.series(served, "-").count(404)
                await respond(send, 404, response_not_found(str(previous)), rid)
                return
            others = found
        task = asyncio.current_task(loop)
        assert task is not None
        rec.task = task
        watcher: asyncio.Task[None] | None = None
        on_lost = rec.client_gone
        if guarded is not None:
            guarded.on_lost = on_lost
        else:
            watcher = loop.create_task(watch_disconnect(receive, rec))
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
                backend = await acquire(pool, ctx, priority, send, rid, rec)
                if backend is None:
                    return
            rec.backend = backend
            if adapter is not None and not await adapter_ready(
                self.adapters, pool, adapter, rec, send, rid
            ):
                return
            rec.queue_wait = loop.time() - t0
            if trace is not None:
                trace.routed(t0 + rec.queue_wait)

            # forward, relay
            await self.forwarder.forward(
                pool, path, body, stream, rid, auth, rec, send, self.responses
            )
        except asyncio.CancelledError:
            if not rec.disconnected:
                raise
            task.uncancel()
            rec.status = 499  # client closed the request; the upstream was cancelled
        finally:
            # account
            rec.finished = True
            if guarded is not None:
                # only our own: a keep-alive connection's next request may have set its
                # callback while this one awaited after its answer was sent
                if guarded.on_lost is on_lost:
                    guarded.on_lost = None
            elif watcher is not None and not watcher.done():
                watcher.cancel()
            if rec.backend is not None:
                pool.release(rec.backend)
            if not rec.usage_known and (rec.started or (rec.sent and rec.status in (499, 504))):
                # Cut short (client gone, engine died, timed out) before the engine's usage
                # arrived: bill what it consumed, the prompt (estimated) and every token
                # event streamed, so an aborted request never comes for free.
                rec.prompt_tokens = prompt_est or estimate_prompt_tokens(body)
                rec.completion_tokens = max(rec.events, 0)
            total = loop.time() - t0
            self.accounting.served(route, rec, total, rid, served)
            if trace is not None:
                trace.finish(
                    t0 + total, rid.decode("latin-1"),
                    rec.backend.label if rec.backend is not None else "-", rec.status,
                    rec.ttft, stream, rec.retries, rec.prompt_tokens, rec.completion_tokens,
                )  # fmt: skip
            tenancy_done(tenancy, adm, est, rid, served, rec, rec.status, total, stream)


def build_app(config: GatewayConfig, tenancy: Tenancy | None = None) -> GatewayApp:
    """The gateway's ASGI application; `app.state` changes backends at run time.
    `tenancy` (optional) adds API keys, limits, the usage ledger and DB routes."""
    return GatewayApp(config, tenancy)
