"""The gateway's own HTTP/1.1 server protocol: httptools parsing driving the ASGI app with
as little work per request as the job allows (issue 29; `h1server.py` serves it).

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
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

import httptools

from inferplane.gateway.asgi import ASGIApp, Message
from inferplane.gateway.bounds import Bounded, HeadTooLarge
from inferplane.gateway.connections import CONNECTION, Connections

_log = logging.getLogger("inferplane.gateway")

BODY_HIGH_WATER = 64 * 1024  # buffered, unread request body above which reading pauses
_DISCONNECT: Message = {"type": "http.disconnect"}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_NO_BODY = frozenset({204, 304})
_STATUS = {s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode()) for s in HTTPStatus}
_METHODS = {m.encode(): m for m in ("GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS")}
_ERROR_500 = (
    b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 21\r\nconnection: close\r\n\r\nInternal Server Error"
)


def _status_line(status: int) -> bytes:
    line = _STATUS.get(status)
    return line if line is not None else b"HTTP/1.1 %d \r\n" % status


class Request:
    """One request's receive/send, on the connection that carries it."""

    __slots__ = ("body", "body_done", "chunked", "complete", "conn", "disconnected",
                 "expect_100", "head", "keep_alive", "length", "more_body", "no_body",
                 "scope", "started", "waiter")  # fmt: skip

    def __init__(self, conn: H1Protocol, scope: dict[str, Any], keep_alive: bool) -> None:
        self.conn = conn
        self.scope = scope
        self.keep_alive = keep_alive
        self.expect_100 = False
        self.body: list[bytes] = []
        self.more_body = True  # the request body is still arriving
        self.body_done = False  # the app was handed the last of the body
        self.waiter: asyncio.Future[None] | None = None
        self.disconnected = False
        self.started = False  # the response head was sent (or is held for the body)
        self.complete = False
        self.head: list[bytes] | None = None  # a head held back to go out with the body
        self.length = -1  # Content-Length bytes still to send; -1: none given
        self.chunked = False
        self.no_body = scope["method"] == "HEAD"

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def receive(self) -> Message:
        conn = self.conn
        if self.expect_100:
            self.expect_100 = False
            if not conn.transport.is_closing():
                conn.transport.write(_CONTINUE)
        while not (self.disconnected or self.complete) and (
            self.body_done or (self.more_body and not self.body)
        ):
            conn.resume_reading()
            self.waiter = conn.loop.create_future()
            await self.waiter
        if self.disconnected or self.complete:
            return _DISCONNECT
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self.body = []
        if self.more_body:
            conn.resume_reading()
        else:
            self.body_done = True
        return {"type": "http.request", "body": body, "more_body": self.more_body}

    async def send(self, message: Message) -> None:
        conn = self.conn
        if conn.write_paused and not self.disconnected:
            await conn.drain_writes()
        if self.disconnected:
            return
        if not self.started:
            if message["type"] != "http.response.start":
                raise RuntimeError(f"expected http.response.start, got {message['type']!r}")
            self._start(message["status"], message.get("headers", ()))
            return
        if self.complete:
            raise RuntimeError(f"unexpected {message['type']!r} after the response completed")
        if message["type"] != "http.response.body":
            raise RuntimeError(f"expected http.response.body, got {message['type']!r}")
        body: bytes = message.get("body", b"")
        more: bool = message.get("more_body", False)
        if self.no_body:
            body = b""
        elif self.chunked:
            body = b"%x\r\n%b\r\n" % (len(body), body) if body else b""
            if not more:
                body += b"0\r\n\r\n"
        elif self.length >= 0:
            self.length -= len(body)
            if self.length < 0:
                raise RuntimeError("response content longer than Content-Length")
        head = self.head
        if head is not None:  # the held head goes out with the first body bytes
            self.head = None
            head.append(body)
            body = b"".join(head)
        if body:
            conn.transport.write(body)
        if not more:
            if self.length > 0 and not self.no_body:
                raise RuntimeError("response content shorter than Content-Length")
            self.complete = True
            self.wake()
            conn.answered(self)

    def _start(self, status: int, headers: Any) -> None:
        self.started = True
        self.expect_100 = False
        parts = [_status_line(status)]
        close_sent = False
        for name, value in headers:
            lname = name.lower()
            if lname == b"content-length":
                self.length = int(value)
            elif lname == b"transfer-encoding":
                self.chunked = value.lower() == b"chunked"
            elif lname == b"connection" and b"close" in value.lower():
                self.keep_alive = False
                close_sent = True
            parts += (name, b": ", value, b"\r\n")
        if status in _NO_BODY:
            self.no_body = True
        elif self.length < 0 and not self.chunked and not self.no_body:
            if self.scope["http_version"] == "1.0":
                self.keep_alive = False  # the body ends where the connection does
            else:
                self.chunked = True
                parts.append(b"transfer-encoding: chunked\r\n")
        if not self.keep_alive and not close_sent:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        if self.length >= 0 and not self.no_body:
            self.head = parts  # a whole response: one write with its body
        else:
            self.conn.transport.write(b"".join(parts))  # a stream: its head now


class H1Protocol(Bounded, asyncio.Protocol):
    """One client connection. `guard`, `app` and `base` are set per server by
    `protocol_for` (`base`: the scope's parts shared by every request)."""

    guard: Connections
    app: ASGIApp
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

    # ---- the phase (for `Bounded`) -----------------------------------------------------

    def _in_request(self) -> bool:
        return self.current is not None

    def _receiving_body(self) -> bool:
        return self.parsing is not None and self.parsing is self.current

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
        keep_alive = version != "1.0" and parser.should_keep_alive()
        if parser.should_upgrade():
            keep_alive = False
        req = Request(self, scope, keep_alive)
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

    def _head_size(self) -> int:
        return len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers)

    def on_body(self, body: bytes) -> None:
        req = self.parsing
        if req is None:
            return
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
        task = self.loop.create_task(self._run(req))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, req: Request) -> None:
        try:
            await self.app(req.scope, req.receive, req.send)
        except BaseException as exc:
            _log.error("exception in the gateway's ASGI app", exc_info=exc)
            if not req.started and not req.disconnected:
                req.keep_alive = False
                self.transport.write(_ERROR_500)
                req.complete = True
                self.answered(req)
            elif not req.complete:
                self.transport.close()
            if not isinstance(exc, Exception):
                raise
        else:
            if not req.complete and not req.disconnected:
                _log.error("the gateway's ASGI app returned without completing its answer")
                if not req.started:
                    self.transport.write(_ERROR_500)
                self.transport.close()

    def answered(self, req: Request) -> None:
        """`req`'s response is complete: close, or go on with the next request."""
        if self.current is req:
            self.current = None
        req.scope = {}  # (the connection outlives the request: drop its references)
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
    # (staticmethod: a plain function as the app must not become a bound method)
    attrs = {"guard": connections, "app": staticmethod(app), "base": base, "tasks": tasks}
    return type("GatewayH1Protocol", (H1Protocol,), attrs)
