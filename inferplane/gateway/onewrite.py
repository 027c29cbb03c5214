"""One socket write per whole response: uvicorn's request cycle, coalescing head and body.

uvicorn writes the status line and headers when `http.response.start` arrives and the body
with the next message: two `write` syscalls (and two segments on the wire) for every JSON
answer. When the start names a Content-Length, the head is held until the body arrives
and both leave in one write. Anything else (SSE and other streams without a length,
a body in several messages, HEAD, a paused or gone client) takes
uvicorn's own path unchanged, so a stream's headers still leave at once (first byte).
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    RequestResponseCycle,
)
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string


class OneWriteCycle(RequestResponseCycle):
    """Set as the class of uvicorn's cycle right after it is made (`adopt`)."""

    _held: Any  # the held `http.response.start` message, or None

    async def send(self, message: Any) -> None:
        held = self._held
        kind = message["type"]
        if kind == "http.response.start" and not self.response_started:
            if self._holdable(message):
                self._held = message  # (a second start replaces it, e.g. uvicorn's 500)
                return
        elif held is not None:
            self._held = None
            if (
                kind == "http.response.body"
                and not message.get("more_body", False)
                and not self.flow.write_paused
                and not self.disconnected
                and self._write_whole(held, message.get("body", b""))
            ):
                return
            await super().send(held)
        await super().send(message)

    def _holdable(self, message: Any) -> bool:
        if self.scope["method"] == "HEAD":
            return False
        return any(name == b"content-length" for name, _ in message.get("headers", ()))

    def _write_whole(self, start: Any, body: bytes) -> bool:
        """Head and body in one write, with uvicorn's own checks; False: not this path."""
        status = start["status"]
        content = [STATUS_LINE[status]]
        length = -1
        for name, value in (*self.default_headers, *start.get("headers", ())):
            if HEADER_RE.search(name):
                raise RuntimeError("Invalid HTTP header name.")
            if HEADER_VALUE_RE.search(value):
                raise RuntimeError("Invalid HTTP header value.")
            name = name.lower()
            if name == b"content-length":
                length = int(value.decode())
            elif name == b"connection" or name == b"transfer-encoding":
                return False  # uvicorn's own handling of these
            content.extend((name, b": ", value, b"\r\n"))
        if length != len(body):
            return False  # uvicorn raises its own error for the mismatch
        if not self.keep_alive:
            content.append(b"connection: close\r\n")
        content.append(b"\r\n")
        content.append(body)
        if self.access_log:  # uvicorn's own line, as its send writes it
            self.access_logger.info(
                '%s - "%s %s HTTP/%s" %d', get_client_addr(self.scope), self.scope["method"],
                get_path_with_query_string(self.scope), self.scope["http_version"], status,
            )  # fmt: skip
        self.response_started = True
        self.waiting_for_100_continue = False
        self.chunked_encoding = False
        self.expected_content_length = 0
        self.transport.write(b"".join(content))
        self.response_complete = True
        self.message_event.set()
        if not self.keep_alive:
            self.transport.close()
        self.on_response()
        return True


def adopt(cycle: RequestResponseCycle | None) -> None:
    """Make uvicorn's freshly built cycle a `OneWriteCycle` (same state, other `send`)."""
    if type(cycle) is RequestResponseCycle:
        cycle.__class__ = OneWriteCycle
        cycle._held = None  # type: ignore[attr-defined]
