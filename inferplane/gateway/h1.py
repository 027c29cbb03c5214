"""The gateway's own HTTP/1.1 server protocol: httptools parsing driving the ASGI app with
as little work per request as the job allows (issue 29; a request's receive/send are in
`h1cycle.py`, and `h1server.py` serves the protocol).

Against uvicorn's protocol (the other `gateway.server`), per request: the scope is a few
precomputed parts and the parsed head; the app's response headers are not re-validated
(the gateway writes them itself); a response with a Content-Length goes out as one write,
head and body together; a request whose body came with its head is answered without a
wait in receive(). Kept from uvicorn: keep-alive, pipelining (one request answered at a
time, reading paused behind it), HTTP/1.0, `Expect: 100-continue`, chunked request
bodies, chunked or close-delimited streaming answers with back-pressure (a paused
transport makes send() wait), 400 for a malformed request, 500 for an app error before
its answer started, and the client's disconnect reported to the app (`on_lost` and
`http.disconnect`). The connection bounds are `bounds.Bounded`'s, as on uvicorn's.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any
from urllib.parse import unquote

import httptools

from inferplane.gateway.asgi import ASGIApp, NativeEntry
from inferplane.gateway.bounds import Bounded, HeadTooLarge
from inferplane.gateway.connections import CONNECTION, Connections
from inferplane.gateway.h1cycle import Request
from inferplane.gateway.routes import MODEL_PATHS

_log = logging.getLogger("inferplane.gateway")

BODY_HIGH_WATER = 64 * 1024  # buffered, unread request body above which reading pauses
_METHODS = {m.encode(): m for m in ("GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS")}
_NATIVE_PATHS = {p.encode(): p for p in MODEL_PATHS}  # POSTed: the app's native entry
_ERROR_500 = (
    b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 21\r\nconnection: close\r\n\r\nInternal Server Error"
)


class H1Protocol(Bounded, asyncio.Protocol):
    """One client connection. `guard`, `app`, `native` and `base` are set per server by
    `protocol_for` (`base`: the scope's parts shared by every request)."""

    guard: Connections
    app: ASGIApp
    native: NativeEntry | None  # the proxied routes without a scope (the app's own entry)
    base: dict[str, Any]
    tasks: set[asyncio.Task[None]]  # the requests' tasks, held until done (and shutdown)

    def __init__(self) -> None:
        self._init_bounds()
        self.loop = asyncio.get_running_loop()
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.current: Request | None = None  # being answered
        self.parsing: Request | None = None  # its body arriving
        self.pending: deque[Request] = deque()  # pipelined behind `current`
        self.idle_since: float | None = None
        self.write_paused = False
        self.read_paused = False
        self._drained: asyncio.Future[None] | None = None
        self._client: tuple[str, int] | None = None
        # The native entry's requests run one after another on one task of the connection
        # (`_serve_native`), not a task each: `queued` is the next, `idle` its wake-up.
        self.runner: asyncio.Task[None] | None = None
        self.queued: Request | None = None
        self.idle: asyncio.Future[None] | None = None
        self.lost = False

    # ---- the phase (for `Bounded`) -----------------------------------------------------

    def _in_request(self) -> bool:
        return self.current is not None

    def _receiving_body(self) -> bool:
        # (also a body still arriving for a request already answered without reading it)
        parsing = self.parsing
        return parsing is not None and (parsing is self.current or self.current is None)

    def _response_started(self) -> bool:
        return self.current is not None and self.current.started

    def _abandon_cycle(self) -> None:
        if self.current is not None:
            self.current.disconnected = True
            self.current.wake()

    def _close_after_answer(self) -> None:
        if self.current is not None:
            self.current.keep_alive = False

    def _idle_expired(self, now: float) -> bool:
        since = self.idle_since
        return since is not None and now - since > self.guard.limits.keepalive_timeout_s

    # ---- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self._open(self.transport):
            peer = transport.get_extra_info("peername")
            if isinstance(peer, tuple) and len(peer) >= 2:
                self._client = (str(peer[0]), int(peer[1]))

    def connection_lost(self, exc: Exception | None) -> None:
        for req in (self.current, *self.pending):
            if req is not None and not req.complete:
                req.disconnected = True
                req.wake()
        self.pending.clear()
        self._wake_writer()
        self.lost = True
        self._wake_runner()
        self._gone()

    def data_received(self, data: bytes) -> None:
        if self.linger_since is not None:
            return  # refused: read and drop what the client still sends
        parsing = self.parsing
        if parsing is None:  # a request head
            if self.head_since is None:
                self.head_since = self.guard.now
                self.head_bytes = 0
                self.idle_since = None
            self.head_bytes += len(data)
        else:
            self.body_at = self.guard.now  # the body timeout is a gap between reads
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # served as plain HTTP (no WebSocket here); the connection closes after
        except (httptools.HttpParserError, HeadTooLarge):
            if self.too_big:
                self._too_large()
            else:
                self._bad_request()
            return
        if (
            self.head_since is not None
            and self.head_bytes > self.guard.limits.max_header_bytes
            and self.linger_since is None
        ):
            self._too_large()  # still no complete head, and already too much of it

    def _bad_request(self) -> None:
        self.head_since = None
        if self.current is not None and self.current.started:
            self.current.flush_step()
            self.transport.close()
        else:
            self._refuse(400, "invalid HTTP request")

    def pause_writing(self) -> None:
        self.write_paused = True
        self.paused_since = self.guard.now

    def resume_writing(self) -> None:
        self.write_paused = False
        self.paused_since = None
        self._wake_writer()

    def _wake_writer(self) -> None:
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    async def drain_writes(self) -> None:
        if self._drained is None:
            self._drained = self.loop.create_future()
        await self._drained

    def pause_reading(self) -> None:
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused and not self.pending:
            self.read_paused = False
            self.transport.resume_reading()

    # ---- parser callbacks --------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.head_since = None
        limit = self.guard.limits.max_header_bytes
        if self.head_bytes > limit and self._head_size() > limit:
            self.too_big = True
            raise HeadTooLarge
        parser = self.parser
        version = parser.get_http_version()
        method = parser.get_method()
        url = self.url
        keep_alive = version != "1.0" and parser.should_keep_alive()
        if parser.should_upgrade():
            keep_alive = False
        path = _NATIVE_PATHS.get(url) if self.native is not None and method == b"POST" else None
        if path is not None:  # no scope: the head goes to the native entry as it is
            req = Request(self, {}, keep_alive, version == "1.0", False)
            req.path = path
            req.headers = self.headers
        else:
            req = Request(self, self._scope(method, version, url), keep_alive,
                          version == "1.0", method == b"HEAD")  # fmt: skip
        for name, value in self.headers:
            if name == b"expect" and value.lower() == b"100-continue":
                req.expect_100 = True
        self.parsing = req
        self.body_at = self.body_since = self.guard.now
        if self.current is None:
            self._start(req)
        else:
            self.pending.append(req)  # pipelined: answered after the one in progress
            self.pause_reading()

    def _scope(self, method: bytes, version: str, url: bytes) -> dict[str, Any]:
        scope = self.base.copy()
        scope["client"] = self._client
        scope["method"] = _METHODS.get(method) or method.decode("ascii")
        scope["http_version"] = version
        if b"?" in url or b"%" in url or url[:1] != b"/":
            parsed = httptools.parse_url(url)
            raw_path = parsed.path
            path = raw_path.decode("ascii")
            scope["path"] = unquote(path) if "%" in path else path
            scope["raw_path"] = raw_path
            scope["query_string"] = parsed.query or b""
        else:
            scope["path"] = url.decode("ascii")
            scope["raw_path"] = url
            scope["query_string"] = b""
        scope["headers"] = self.headers
        scope[CONNECTION] = self
        return scope

    def _head_size(self) -> int:
        return len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers)

    def on_body(self, body: bytes) -> None:
        req = self.parsing
        if req is None or req.complete or req.disconnected:
            return  # answered without reading its body (413, 401, ...): dropped
        req.body.append(body)
        req.wake()
        if len(req.body) > 1 and sum(map(len, req.body)) > BODY_HIGH_WATER:
            self.pause_reading()

    def on_message_complete(self) -> None:
        req = self.parsing
        if req is None:
            return
        self.parsing = None
        req.more_body = False
        req.wake()

    # ---- requests ----------------------------------------------------------------------

    def _start(self, req: Request) -> None:
        self.current = req
        self.idle_since = None
        if req.path is not None:
            self.queued = req
            if self.runner is None:
                self._spawn_runner()
            else:
                self._wake_runner()
            return
        task = self.loop.create_task(self._run(req))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _spawn_runner(self) -> None:
        task = self.runner = self.loop.create_task(self._serve_native())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _wake_runner(self) -> None:
        idle, self.idle = self.idle, None
        if idle is not None and not idle.done():
            idle.set_result(None)

    async def _serve_native(self) -> None:
        """The connection's native requests in turn, for as long as it lives (a keep-alive
        client's next request wakes this task instead of costing a new one)."""
        try:
            while True:
                req = self.queued
                if req is None:
                    if self.lost:
                        return
                    self.idle = self.loop.create_future()
                    await self.idle
                    continue
                self.queued = None
                await self._run(req)
        finally:
            self.runner = None
            if self.queued is not None:
                self._spawn_runner()  # (cancelled with one queued: it still gets served)

    async def _run(self, req: Request) -> None:
        try:
            if req.path is not None and self.native is not None:
                await self.native(req.path, req.headers, req.receive, req, self)
            else:
                await self.app(req.scope, req.receive, req)
        except BaseException as exc:
            _log.error("exception in the gateway's ASGI app", exc_info=exc)
            if not req.started and not req.disconnected:
                req.keep_alive = False
                self.transport.write(_ERROR_500)
                req.complete = True
                self.answered(req)
            elif not req.complete:
                req.flush_step()  # what it sent before it failed
                self.transport.close()
            if not isinstance(exc, Exception):
                raise
        else:
            if not req.complete and not req.disconnected:
                _log.error("the gateway's ASGI app returned without completing its answer")
                if not req.started:
                    self.transport.write(_ERROR_500)
                req.flush_step()
                self.transport.close()

    def answered(self, req: Request) -> None:
        """`req`'s response is complete: close, or go on with the next request."""
        if self.current is req:
            self.current = None
        req.scope = {}  # (the connection outlives the request: drop its references)
        req.headers = []
        if not req.keep_alive:
            self.transport.close()
            return
        if self.pending:
            nxt = self.pending.popleft()
            self.body_at = self.body_since = self.guard.now
            self._start(nxt)
            if not self.pending:
                self.resume_reading()
            return
        self.resume_reading()
        if self.parsing is None and self.head_since is None:
            self.idle_since = self.guard.now


def protocol_for(
    connections: Connections, app: ASGIApp, server: tuple[str, int] | None, root_path: str = ""
) -> type[H1Protocol]:
    """A protocol class bound to one gateway's app and `Connections` (`tasks`: the
    requests' tasks, which the server waits for and cancels at shutdown)."""
    base: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "scheme": "http",
        "server": server,
        "root_path": root_path,
    }
    tasks: set[asyncio.Task[None]] = set()
    # Only the gateway's own app has one (a wrapper around it must see every request).
    entry = getattr(app, "native_entry", None)
    native = entry() if callable(entry) else None
    # (staticmethod: plain functions must not become bound methods)
    attrs = {"guard": connections, "app": staticmethod(app), "base": base, "tasks": tasks,
             "native": staticmethod(native) if native is not None else None}  # fmt: skip
    return type("GatewayH1Protocol", (H1Protocol,), attrs)
