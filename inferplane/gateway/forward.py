"""Forward: the request to its replica through the one upstream client, with retries.

A replica that cannot be reached, or answers a 5xx while retries are left, is replaced by
another one of the pool; the deadlines (first token / total / idle) bound the whole
exchange. The answer goes on to `relay` (JSON or SSE). `/v1/responses/{id}` calls reach
the replica that holds the response through the same client (`forward_by_id`).
"""

from __future__ import annotations

import asyncio

from inferplane.gateway.asgi import JSON, Send, respond
from inferplane.gateway.backend import Backend, failure_text
from inferplane.gateway.deadlines import Deadlines
from inferplane.gateway.errors import error_body, sse_error_event
from inferplane.gateway.health import PassiveHealth
from inferplane.gateway.lora import AdapterHoldings
from inferplane.gateway.metrics import GatewayMetrics
from inferplane.gateway.pool import Pool
from inferplane.gateway.record import Record
from inferplane.gateway.relay import relay_json, relay_stream
from inferplane.gateway.routes import ResponseOwners
from inferplane.gateway.scorers import RouteContext
from inferplane.gateway.upstream import UpstreamBodyError, UpstreamClient, UpstreamError


class Forwarder:
    def __init__(
        self, upstream: UpstreamClient, health: PassiveHealth, metrics: GatewayMetrics,
        adapters: AdapterHoldings,
    ) -> None:  # fmt: skip
        self.upstream = upstream
        self.health = health
        self.metrics = metrics
        self.adapters = adapters
        self.deadlines = Deadlines()  # first byte / idle / total, one sweep for all

    def _retry_replica(
        self, pool: Pool, rec: Record, tried: list[Backend], now: float
    ) -> Backend | None:
        """Another replica for a retry; a LoRA request only where its adapter is loaded."""
        ctx = RouteContext(now=now)
        adapter = rec.adapter
        if adapter is None:
            return pool.try_acquire(ctx, exclude=tried)
        ctx.holders = self.adapters.holders(adapter)  # prefer the others holding it
        ctx.warm = self.adapters.warm(adapter)
        nxt = pool.try_acquire(ctx, exclude=tried)
        if nxt is not None and not self.adapters.holds(nxt.url, adapter):
            pool.release(nxt)
            return None
        return nxt

    async def forward(
        self, pool: Pool, path: str, body: bytes, stream: bool, rid: bytes,
        auth: bytes | None, rec: Record, send: Send, responses: ResponseOwners,
    ) -> None:  # fmt: skip
        """Send `body` to `rec.backend` (acquired), retrying elsewhere; relay the answer."""
        loop = asyncio.get_running_loop()
        route = pool.route
        timeouts = route.timeouts
        upstream = self.upstream
        health = self.health
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
        task = rec.task or asyncio.current_task()
        assert task is not None
        deadlines = self.deadlines
        deadline = deadlines.start(loop, task, first_deadline)
        try:
            try:
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
                        rec.trace_headers
                        if rec.trace is None
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
                        health.failure(pool, backend, failure)
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
                    nxt = self._retry_replica(pool, rec, tried, loop.time())
                    if nxt is None or len(tried) > route.retries:
                        if nxt is not None:
                            pool.release(nxt)
                        if len(suspects) == 1 and error_payload is not None:
                            # Nowhere else to try it: an unconfirmed 5xx of this replica.
                            health.error_5xx(pool, suspects[0])
                        await upstream_failed(send, rid, rec, failure, error_payload)
                        return
                    pool.release(backend)
                    rec.backend = backend = nxt
                    rec.retries += 1
                    self.metrics.retries.labels(route.name).inc()

                status = conn.status
                rec.status = status
                if status < 500:
                    for suspect in suspects:  # confirmed: this request works elsewhere
                        health.error_5xx(pool, suspect)
                elif not suspects:
                    health.error_5xx(pool, backend)  # unconfirmed (no other replica tried)
                # else: a 5xx on two replicas is the request's own; neither is counted.
                if stream and status == 200:
                    await relay_stream(
                        conn, send, rid, rec, deadline, t_sent, timeouts.idle_s,
                        total_deadline, pool, path, health, responses,
                    )  # fmt: skip
                    return
                await relay_json(conn, send, rid, rec, t_sent, pool, health, responses)
            except asyncio.CancelledError:
                if not deadline.timed_out():
                    raise
                raise TimeoutError from None
            finally:
                deadlines.end(deadline)
        except TimeoutError:
            message = f"upstream timed out (model `{route.name}`)"
            failed = rec.backend
            # Reaching `total_s` is the request's own deadline (a long generation), not the
            # replica's failure: a stream that kept making progress is long, not broken, and
            # a non-streaming answer counts only if the replica's /health fails too. A
            # first-byte or idle timeout is the replica's.
            if failed is not None:
                if min(loop.time(), deadline.at) < total_deadline - 1e-3:
                    health.failure(pool, failed, f"{failed.public} timed out")
                elif not stream:
                    health.confirm_hung(pool, failed)
            rec.finished = True
            rec.status = 504
            if rec.started:  # mid-stream: end the stream with an error event
                await send({"type": "http.response.body", "body": sse_error_event(504, message)})
            else:
                await respond(send, 504, error_body(504, message), rid)

    async def forward_by_id(
        self, backend: Backend, pool: Pool, method: str, target: str, body: bytes,
        headers: bytes, rid: bytes, send: Send,
    ) -> None:  # fmt: skip
        """`GET /v1/responses/{id}` or `POST .../cancel` (`target`: path and query) to the
        replica holding the response; the answer relayed as JSON or SSE."""
        timeouts = pool.route.timeouts
        started = False
        conn = None
        try:
            async with asyncio.timeout(timeouts.total_s):
                conn = await self.upstream.request(
                    method, backend.url, target, body, headers, timeouts.connect_s
                )
                ctype = conn.content_type or JSON
                if not ctype.startswith(b"text/event-stream"):
                    payload = await conn.read_all()
                    conn.release()
                    await respond(send, conn.status, payload, rid, ctype)
                    return
                await send({"type": "http.response.start", "status": conn.status, "headers": [
                    (b"content-type", ctype), (b"cache-control", b"no-cache"),
                    (b"x-request-id", rid)]})  # fmt: skip
                started = True
                chunk = await conn.read_chunk()
                while chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    chunk = await conn.read_chunk()
                conn.release()
                await send({"type": "http.response.body", "body": b""})
        except (UpstreamError, UpstreamBodyError, TimeoutError) as exc:
            if conn is not None:
                conn.close()
            path = target.partition("?")[0]
            message = f"{backend.public} failed to answer {method} {path}: "
            message += failure_text(exc, backend)
            if started:
                await send({"type": "http.response.body", "body": sse_error_event(502, message)})
            else:
                await respond(send, 502, error_body(502, message), rid)
        except BaseException:
            if conn is not None:
                conn.close()
            raise


async def upstream_failed(
    send: Send, rid: bytes, rec: Record, message: str,
    payload: tuple[int, bytes, bytes] | None,
) -> None:  # fmt: skip
    """Out of replicas to try: the engine's own 5xx when there was one, else a 502."""
    rec.finished = True
    if payload is not None:  # out of retries: pass the engine's own 5xx through
        status, body, ctype = payload
        rec.status = status
        await respond(send, status, body, rid, ctype or JSON)
    else:
        rec.status = 502
        await respond(send, 502, error_body(502, message), rid)
