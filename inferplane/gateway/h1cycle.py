"""One request on the gateway's own HTTP/1.1 protocol (`h1.py`): its ASGI receive() and
send(). A response with a Content-Length is held at http.response.start and written with
its body in one write; any other is chunked on HTTP/1.1 and close-delimited on HTTP/1.0;
a paused transport makes send() wait.

A stream's head is held until the app's current step ends (one loop callback, `uncork`)
and goes out with the body bytes the app sends in that step; body bytes are written at
once, never held for more. A relayed stream whose engine bytes are all buffered already
(head, events and the end sent in one step) costs one write and one client read, not
three; a stream paced by its engine costs one write per event, as before."""

from __future__ import annotations

import asyncio
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from inferplane.gateway.asgi import DirectSend, Message

if TYPE_CHECKING:
    from inferplane.gateway.h1 import H1Protocol

_DISCONNECT: Message = {"type": "http.disconnect"}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_NO_BODY = frozenset({204, 304})
# Bytes held in a stream head's step above which they go out at once.
_CORK_BYTES = 64 * 1024
_STATUS = {s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode()) for s in HTTPStatus}


def _status_line(status: int) -> bytes:
    line = _STATUS.get(status)
    return line if line is not None else b"HTTP/1.1 %d \r\n" % status


class Request(DirectSend):
    """One request's receive/send, on the connection that carries it; the object itself is
    its ASGI send (`__call__`), and `whole` answers without the two messages.
    `path` is set for a request served by the app's native entry (no scope: `scope` is
    then empty and `headers` holds the parsed head)."""

    __slots__ = ("body", "body_done", "chunked", "complete", "conn", "cork", "disconnected",
                 "expect_100", "headers", "held", "held_bytes", "http10", "keep_alive",
                 "length", "more_body", "no_body", "path", "scope", "started",
                 "waiter")  # fmt: skip

    def __init__(
        self, conn: H1Protocol, scope: dict[str, Any], keep_alive: bool, http10: bool,
        head: bool,
    ) -> None:  # fmt: skip
        self.conn = conn
        self.scope = scope
        self.headers: list[tuple[bytes, bytes]] = []
        self.path: str | None = None
        self.http10 = http10
        self.keep_alive = keep_alive
        self.expect_100 = False
        self.body: list[bytes] = []
        self.more_body = True  # the request body is still arriving
        self.body_done = False  # the app was handed the last of the body
        self.waiter: asyncio.Future[None] | None = None
        self.disconnected = False
        self.started = False  # the response head was sent (or is held for the body)
        self.complete = False
        self.held: list[bytes] = []  # answer bytes not written yet (see `_emit`)
        self.held_bytes = 0
        self.cork: asyncio.Handle | None = None  # the end of the step: `uncork`
        self.length = -1  # Content-Length bytes still to send; -1: none given
        self.chunked = False
        self.no_body = head

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
        self._body(message.get("body", b""), message.get("more_body", False))

    __call__ = send

    def whole(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        """Both messages of a whole answer at once, when send() would not wait (the
        transport not paused): False leaves the answer to send()."""
        if self.started or self.conn.write_paused or self.disconnected:
            return False
        self._start(status, headers)
        self._body(body, False)
        return True

    def _body(self, body: bytes, more: bool) -> None:
        conn = self.conn
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
        self._emit(body, not more)
        if not more:
            if self.length > 0 and not self.no_body:
                raise RuntimeError("response content shorter than Content-Length")
            self.complete = True
            self.wake()
            conn.answered(self)

    def _emit(self, data: bytes, last: bool) -> None:
        """Answer bytes in order, with anything held; in the step of a stream's head they
        are held with it (up to `_CORK_BYTES`) until the step ends or the answer does."""
        held = self.held
        if held:
            held.append(data)
            if not last and self.cork is not None:
                self.held_bytes += len(data)
                if self.held_bytes < _CORK_BYTES:
                    return
            data = b"".join(held)
            held.clear()
        if data:
            self.conn.transport.write(data)

    def uncork(self) -> None:
        """Write what is held (the app's step ended, or the connection is closing)."""
        self.cork = None
        held = self.held
        if held:
            data = held[0] if len(held) == 1 else b"".join(held)
            held.clear()
            transport = self.conn.transport
            if not self.disconnected and not transport.is_closing():
                transport.write(data)

    def flush_step(self) -> None:
        """Before the connection closes: the bytes this step sent (not a whole response's
        head held for a body that never came)."""
        if self.cork is not None:
            self.cork.cancel()
            self.uncork()

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
            if self.http10:
                self.keep_alive = False  # the body ends where the connection does
            else:
                self.chunked = True
                parts.append(b"transfer-encoding: chunked\r\n")
        if not self.keep_alive and not close_sent:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        if self.length >= 0 and not self.no_body:
            self.held = parts  # a whole response: one write with its body, no callback
        else:
            self.held = [b"".join(parts)]  # a stream: its head with this step's bytes
            self.cork = self.conn.loop.call_soon(self.uncork)
