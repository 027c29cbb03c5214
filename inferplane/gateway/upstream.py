"""A lean HTTP/1.1 client for the proxy hot path: keep-alive pools per replica, httptools
parsing, one write per request, body chunks handed over as they arrive.

Measured against aiohttp's ClientSession on the gateway benchmark: a general-purpose
client spends more per request (request objects, header multidicts, tracing, cookies)
than the rest of the gateway together. Probes and other cold paths still use aiohttp.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Callable
from typing import cast
from urllib.parse import urlsplit

import httptools

# Buffered but unread body bytes above which we stop reading from the engine.
_HIGH_WATER = 1 << 20


class UpstreamError(Exception):
    """No response started: connect failure, or the connection died before the status
    line. Safe to retry on another replica."""


class UpstreamBodyError(Exception):
    """The connection failed after the response started (e.g. the engine died mid-stream)."""


class ReplicaEjected(Exception):
    """The gateway ejected the replica while this exchange was in flight (`abort`)."""


class Endpoint:
    """Where a replica listens, parsed once."""

    __slots__ = ("busy", "host", "host_header", "idle", "port", "ssl")

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.host = parts.hostname
        self.ssl: ssl.SSLContext | None = (
            ssl.create_default_context() if parts.scheme == "https" else None
        )
        self.port = parts.port or (443 if self.ssl else 80)
        self.host_header = parts.netloc.encode("latin-1")
        self.idle: deque[Connection] = deque()
        self.busy: set[Connection] = set()  # carrying a request now (what `abort` ends)


class Connection(asyncio.Protocol):
    """One keep-alive connection; carries one request at a time."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.transport: asyncio.Transport | None = None
        self._chunks: deque[bytes] = deque()
        # The parser's body callback is the deque's own append (httptools looks callbacks
        # up once, at its creation): a stream's events arrive as one HTTP chunk each, and a
        # Python method per chunk was most of what a buffered stream cost to read.
        self.on_body: Callable[[bytes], None] = self._chunks.append
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.error: BaseException | None = None
        self._loop = asyncio.get_running_loop()
        self._waiter: asyncio.Future[None] | None = None
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.content_type = b""
        self.keep_alive = True
        self.headers_done = False
        self.complete = False
        self.got_data = False
        self._chunks.clear()
        self._buffered = 0
        self._paused = False

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.got_data = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(exc)
            self.close()
            return
        if self._chunks:  # body bytes arrived (counted with their framing: a high-water)
            self._buffered += len(data)
            if self._buffered > _HIGH_WATER and not self._paused and self.transport is not None:
                self._paused = True
                self.transport.pause_reading()  # a slow client must not make us buffer
            self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete:
            self._fail(exc or ConnectionResetError("upstream closed the connection"))

    # -- httptools callbacks -------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        lname = name.lower()
        if lname == b"content-type":
            self.content_type = value
        elif lname == b"connection" and b"close" in value.lower():
            self.keep_alive = False

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        # httptools' should_keep_alive() reads false by the time we could ask it.
        if self.parser.get_http_version() != "1.1":
            self.keep_alive = False
        self.headers_done = True
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()

    # -- internals ---------------------------------------------------------------------

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def close(self) -> None:
        self.closed = True
        self.endpoint.busy.discard(self)
        if self.transport is not None:
            self.transport.close()

    def abort(self, reason: str) -> None:
        """End the exchange now: whoever waits on it gets an error naming `reason`."""
        self._fail(ReplicaEjected(reason))
        self.close()

    # -- the request ---------------------------------------------------------------------

    def send(self, head: bytes, body: bytes) -> None:
        self._reset()
        assert self.transport is not None
        self.endpoint.busy.add(self)
        self.transport.write(head + body)

    async def wait_headers(self) -> None:
        while not self.headers_done:
            if self.error is not None:
                raise UpstreamError(str(self.error) or type(self.error).__name__)
            await self._wait()

    async def read_chunk(self) -> bytes:
        """The next body bytes; b"" once the body is complete."""
        while not self._chunks:
            if self.complete:
                return b""
            if self.error is not None:
                raise UpstreamBodyError(str(self.error) or type(self.error).__name__)
            await self._wait()
        chunks = self._chunks
        # Hand over everything that arrived: the parser yields one piece per HTTP chunk,
        # and one send per SSE event would multiply the per-stream cost.
        chunk = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        if self._paused and self._buffered < _HIGH_WATER // 2 and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return chunk

    async def read_all(self) -> bytes:
        while not self.complete:
            if self.error is not None:
                raise UpstreamBodyError(str(self.error) or type(self.error).__name__)
            await self._wait()
        chunks = self._chunks
        if len(chunks) == 1:
            return chunks.popleft()
        data = b"".join(chunks)
        chunks.clear()
        return data

    def release(self) -> None:
        """Back to the idle pool when the exchange finished cleanly, else closed."""
        if self.complete and not self.closed and self.keep_alive:
            self.endpoint.busy.discard(self)
            self.endpoint.idle.append(self)
        else:
            self.close()


class UpstreamClient:
    """Keep-alive connection pools keyed by replica URL (P42)."""

    def __init__(self, connect_timeout_s: float = 10.0) -> None:
        self.connect_timeout_s = connect_timeout_s
        self._endpoints: dict[str, Endpoint] = {}

    def endpoint(self, url: str) -> Endpoint:
        ep = self._endpoints.get(url)
        if ep is None:
            ep = self._endpoints[url] = Endpoint(url)
        return ep

    async def _connect(self, ep: Endpoint, timeout_s: float) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout_s):
                _, conn = await loop.create_connection(
                    lambda: Connection(ep), ep.host, ep.port, ssl=ep.ssl
                )
        except (OSError, TimeoutError) as exc:
            # The reason, not str(exc): that names the engine's address, and this message
            # reaches the client.
            why = getattr(exc, "strerror", None) or type(exc).__name__
            raise UpstreamError(f"connect failed: {type(exc).__name__}: {why}") from None
        return conn

    async def post(
        self,
        url: str,
        path: str,
        body: bytes,
        extra_headers: bytes,
        connect_timeout_s: float | None = None,
    ) -> Connection:
        """Send a JSON POST and wait for the response headers. The caller reads the body
        from the returned connection and then calls `release()` (or `close()` on failure).
        `extra_headers` are complete `Name: value\\r\\n` lines."""
        ep = self.endpoint(url)
        head = b"".join(
            (
                b"POST ",
                path.encode("latin-1"),
                b" HTTP/1.1\r\nHost: ",
                ep.host_header,
                b"\r\nContent-Type: application/json\r\nContent-Length: ",
                b"%d" % len(body),
                b"\r\n",
                extra_headers,
                b"\r\n",
            )
        )
        # The common case inline (an idle keep-alive connection): one coroutine fewer.
        while ep.idle:
            conn = ep.idle.pop()
            if conn.closed:
                continue
            try:
                conn.send(head, body)
                await conn.wait_headers()
                return conn
            except UpstreamError:
                conn.close()
                if conn.got_data or isinstance(conn.error, ReplicaEjected):
                    raise  # (an ejected replica: retry elsewhere, not on a new connection)
            except BaseException:
                conn.close()
                raise
        return await self._exchange(ep, head, body, connect_timeout_s)

    async def request(
        self,
        method: str,
        url: str,
        target: str,
        body: bytes,
        extra_headers: bytes,
        connect_timeout_s: float | None = None,
    ) -> Connection:
        """Any method (`target`: path and query); a body, if any, is sent as JSON."""
        ep = self.endpoint(url)
        ctype = b"Content-Type: application/json\r\n" if body else b""
        head = b"".join(
            (
                method.encode("latin-1"),
                b" ",
                target.encode("latin-1"),
                b" HTTP/1.1\r\nHost: ",
                ep.host_header,
                b"\r\n",
                ctype,
                b"Content-Length: %d\r\n" % len(body),
                extra_headers,
                b"\r\n",
            )
        )
        return await self._exchange(ep, head, body, connect_timeout_s)

    async def _exchange(
        self, ep: Endpoint, head: bytes, body: bytes, connect_timeout_s: float | None
    ) -> Connection:
        timeout_s = connect_timeout_s or self.connect_timeout_s
        while ep.idle:
            conn = ep.idle.pop()
            if conn.closed:
                continue
            try:
                conn.send(head, body)
                await conn.wait_headers()
                return conn
            except UpstreamError:
                conn.close()
                if conn.got_data or isinstance(conn.error, ReplicaEjected):
                    raise  # (an ejected replica: retry elsewhere, not on a new connection)
                # The engine closed this idle connection meanwhile: try the next one.
            except BaseException:
                conn.close()
                raise
        conn = await self._connect(ep, timeout_s)
        try:
            conn.send(head, body)
            await conn.wait_headers()
        except BaseException:
            conn.close()
            raise
        return conn

    def abort(self, url: str, reason: str) -> int:
        """End every exchange in flight to `url` (an ejected replica); how many there were."""
        ep = self._endpoints.get(url)
        if ep is None:
            return 0
        busy = list(ep.busy)
        for conn in busy:
            conn.abort(reason)
        return len(busy)

    def close(self) -> None:
        for ep in self._endpoints.values():
            while ep.idle:
                ep.idle.pop().close()
        self._endpoints.clear()
