"""Relay: the engine's answer back to the client, a JSON body or an SSE stream.

Streams pass through as bytes as they arrive (never buffered or re-framed, so back-pressure
and first-byte latency are the engine's), counting token events so a stream cut short is
still billed for what it streamed. Usage is read from the bytes (`record.usage_from`).
"""

from __future__ import annotations

import asyncio

from inferplane.gateway.asgi import JSON, Send, respond
from inferplane.gateway.deadlines import Deadline
from inferplane.gateway.errors import error_body, sse_error_event
from inferplane.gateway.health import PassiveHealth
from inferplane.gateway.pool import Pool
from inferplane.gateway.record import Record, usage_from
from inferplane.gateway.replica_header import HEADER as REPLICA_HEADER
from inferplane.gateway.routes import RESPONSES_PATH, ResponseOwners
from inferplane.gateway.stream_errors import InbandError
from inferplane.gateway.upstream import Connection, UpstreamBodyError

_RESPONSES_TOKEN_EVENT = b"event: response.output_text.delta\n"
# uvloop's clock ticks in milliseconds: a first byte inside the tick the request was sent in
# still came (a TTFT of 0 means none did: no histogram sample, no first-token span).
_WITHIN_ONE_TICK_S = 1e-6
_DONE = b"[DONE]\n\n"


async def relay_json(
    conn: Connection, send: Send, rid: bytes, rec: Record, t_sent: float, pool: Pool,
    health: PassiveHealth, responses: ResponseOwners,
) -> None:  # fmt: skip
    """A whole (non-streaming) answer: read it, note its usage, send it in one message."""
    backend = rec.backend
    assert backend is not None
    status = conn.status
    try:
        payload = await conn.read_all()
    except UpstreamBodyError as exc:
        conn.close()
        why = f"{backend.public} failed while responding: {exc}"
        health.failure(pool, backend, why)
        rec.finished = True
        rec.status = 502
        await respond(send, 502, error_body(502, why), rid)
        return
    except BaseException:
        conn.close()  # cancelled or timed out: drop the upstream connection
        raise
    rec.ttft = max(asyncio.get_running_loop().time() - t_sent, _WITHIN_ONE_TICK_S)
    conn.release()
    if status < 500:
        health.succeeded(backend)
    if status == 200:
        rec.prompt_tokens, rec.completion_tokens = usage_from(payload)
        rec.usage_known = True
        if rec.keeps_response:
            responses.learn(payload, pool.route.name, backend.url, rec.key_id)
    rec.finished = True
    extra = rec.headers
    if rec.show_replica:
        extra = (*extra, (REPLICA_HEADER, backend.label.encode()))
    await respond(send, status, payload, rid, conn.content_type or JSON, extra)


async def relay_stream(
    conn: Connection, send: Send, rid: bytes, rec: Record, deadline: Deadline,
    t_sent: float, idle_s: float, total_deadline: float, pool: Pool, path: str,
    health: PassiveHealth, responses: ResponseOwners,
) -> None:  # fmt: skip
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
        rec.ttft = max(loop.time() - t_sent, _WITHIN_ONE_TICK_S)
        stripper = rec.stripper
        # Chat streams open with a role-only event that carries no token.
        rec.events = -1 if path == "/v1/chat/completions" and b'"role"' in chunk else 0
        marker = b"\n\n"  # one SSE event per blank line
        if path == RESPONSES_PATH:
            marker = _RESPONSES_TOKEN_EVENT  # its other events carry no token
        if rec.keeps_response:
            responses.learn(chunk, pool.route.name, backend.url, rec.key_id)
        token_events = marker == b"\n\n"  # (an error event is one, and carries none)
        ended = False
        while chunk:
            # The engine's whole answer is in: this piece goes with the response's end.
            end = conn.complete
            if stripper is not None:
                chunk = stripper.feed(chunk)
                if end:
                    chunk += stripper.flush()
            if end:
                # The usage the engine sent (the stream's last, or the one the stripper
                # took out) bills it, so this piece's events need no count; read before
                # the send, so that a cancel during it still bills what was generated.
                usage = stripper.usage if stripper is not None else b""
                rec.prompt_tokens, rec.completion_tokens = usage_from(usage or last + chunk)
                rec.usage_known = rec.prompt_tokens > 0 or rec.completion_tokens > 0
            if chunk or end:
                await send({"type": "http.response.body", "body": chunk, "more_body": not end})
                ended = end
                if chunk:
                    if not rec.usage_known:
                        rec.events += chunk.count(marker)
                    prev, last = last, chunk
                    if inband.feed(chunk) and token_events:
                        rec.events -= 1
            if end:
                break
            deadline.at = min(loop.time() + idle_s, total_deadline)  # the idle deadline
            chunk = await conn.read_chunk()
        if stripper is not None:
            if not ended:
                rest = stripper.flush()
                if rest:
                    await send({"type": "http.response.body", "body": rest, "more_body": True})
                    prev, last = last, rest
                    inband.feed(rest)
            prev, last = prev + last, stripper.usage
    except UpstreamBodyError as exc:
        conn.close()
        health.failure(pool, backend, f"{backend.public} failed mid-stream")
        rec.status = 502
        rec.finished = True
        # Close a half-sent event first so the error event parses on its own.
        tail = b"" if last.endswith(b"\n\n") or not last else b"\n\n"
        inband.finish()
        if inband.status is not None:  # the engine said why already: one error event
            rec.status = inband.status
            if not last.endswith(_DONE):
                await send({"type": "http.response.body", "body": tail + b"data: " + _DONE})
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
        health.succeeded(backend)
    else:  # a 200 that failed: counted by the engine's code, billed as a cut stream
        rec.status = inband.status
        if inband.status >= 500:
            health.failure(
                pool, backend, f"{backend.public} ended a stream with an error: "
                f"{inband.message}",
            )  # fmt: skip
    if last.endswith(_DONE):
        rec.events -= 1
    rec.finished = True
    if not ended:
        rec.prompt_tokens, rec.completion_tokens = usage_from(prev + last)
        rec.usage_known = rec.prompt_tokens > 0 or rec.completion_tokens > 0
        await send({"type": "http.response.body", "body": b""})
