"""The per-connection half of the client-connection bounds (`connections.py`), shared by
both server protocols: uvicorn's (`GuardedProtocol`) and the gateway's own (`h1.py`).

`Bounded` keeps the clocks of one connection (head, body, paused writes, lingering after
an error) and enforces them when `Connections` sweeps; a protocol tells it the phase of
its request in progress through five small hooks (`_in_request`, `_receiving_body`,
`_response_started`, `_abandon_cycle`, `_close_after_answer`) and `_idle_expired`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

from inferplane.gateway.errors import error_body

if TYPE_CHECKING:
    from inferplane.gateway.connections import Connections

LINGER_S = 2.0  # how long a refused connection may keep sending before it is closed
MAX_LINGERING = 64  # refused connections waiting out LINGER_S; beyond: closed at once
_PHRASES = {400: b"Bad Request", 408: b"Request Timeout",
            431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}  # fmt: skip


def error_response(status: int, message: str, extra: bytes = b"") -> bytes:
    """A whole `connection: close` JSON error response, as bytes."""
    body = error_body(status, message)
    return b"".join((
        b"HTTP/1.1 %d %s\r\n" % (status, _PHRASES[status]),
        b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body),
        extra, b"connection: close\r\n\r\n", body,
    ))  # fmt: skip


REFUSED = error_response(
    503, "the gateway is at its connection limit; retry later", b"retry-after: 1\r\n"
)
SHUTTING_DOWN = "the gateway is shutting down; retry against another one"


class HeadTooLarge(Exception):
    """Raised from a parser callback to stop parsing a request head above the limit."""


class Bounded:
    """The bounds of one client connection; mixed into an asyncio protocol."""

    guard: Connections
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop

    def _init_bounds(self) -> None:
        self.head_since: float | None = None  # a head is awaited/arriving since then
        self.head_bytes = 0  # bytes received for the head in progress
        self.body_at = 0.0  # last read of the request body in progress
        self.body_since = 0.0  # the head of the request whose body is arriving ended then
        self.paused_since: float | None = None  # the client stopped reading its answer
        self.linger_since: float | None = None  # answered with an error, half-closed
        self.too_big = False
        self.counted = False  # in `guard.live`
        self.on_lost: Callable[[], None] | None = None  # the request in flight: client gone

    # ---- the protocol's phase (overridden) ---------------------------------------------

    def _in_request(self) -> bool:
        """A request is being handled (its body arriving or its answer being sent)."""
        raise NotImplementedError

    def _receiving_body(self) -> bool:
        raise NotImplementedError

    def _response_started(self) -> bool:
        raise NotImplementedError

    def _abandon_cycle(self) -> None:
        """The request in progress sees a disconnect (its receive() returns at once)."""
        raise NotImplementedError

    def _close_after_answer(self) -> None:
        raise NotImplementedError

    def _idle_expired(self, now: float) -> bool:
        """An idle keep-alive connection past its timeout (uvicorn times it itself)."""
        return False

    # ---- connection --------------------------------------------------------------------

    def _open(self, transport: asyncio.Transport) -> bool:
        """TCP_NODELAY, and the connection cap: False when refused (503, lingering)."""
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError, AttributeError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        guard = self.guard
        guard.now = self.loop.time()
        if not guard.admit(self):
            self.transport = transport
            self._linger(REFUSED)
            return False
        self.counted = True
        self.head_since = guard.now  # the first head is timed from the connection's opening
        return True

    def _gone(self) -> None:
        if self.counted:
            self.guard.live.discard(self)
            self.counted = False
        on_lost, self.on_lost = self.on_lost, None
        if on_lost is not None:
            on_lost()

    # ---- bounds ------------------------------------------------------------------------

    def check(self, now: float) -> None:
        """One sweep: enforce the timeouts of the connection's phase."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        lim = self.guard.limits
        if self.linger_since is not None:
            if now - self.linger_since > LINGER_S:
                transport.close()
            return
        if self.head_since is not None and not self._in_request():
            if now - self.head_since > lim.header_timeout_s:
                self.guard.timed_out["header"] += 1
                if self.head_bytes == 0:
                    transport.close()  # never sent a byte of it: nothing to answer
                else:
                    msg = f"request head not received within {lim.header_timeout_s:g} s"
                    self._refuse(408, msg)
        elif self._receiving_body():
            if now - self.body_at > lim.body_timeout_s:
                self.guard.timed_out["body"] += 1
                self._refuse(408, f"no request body data for {lim.body_timeout_s:g} s")
            elif now - self.body_since > lim.body_total_timeout_s:
                self.guard.timed_out["body"] += 1
                self._refuse(408, "request body not received within "
                             f"{lim.body_total_timeout_s:g} s")  # fmt: skip
        elif self._in_request():
            if self.paused_since is not None and now - self.paused_since > lim.send_timeout_s:
                self.guard.timed_out["send"] += 1
                self._abandon_cycle()
                transport.close()
        elif self._idle_expired(now):
            transport.close()

    def drain(self) -> None:
        """The gateway is shutting down (`Connections.drain`, the server's shutdown)."""
        transport = self.transport
        if transport is None or transport.is_closing() or self.linger_since is not None:
            return
        if self.head_since is not None and self.head_bytes and not self._in_request():
            self._refuse(503, SHUTTING_DOWN)
        elif not self._in_request():
            transport.close()  # idle
        elif self._receiving_body():
            self._refuse(503, SHUTTING_DOWN)
        else:
            self._close_after_answer()

    def _too_large(self) -> None:
        self.guard.too_large += 1
        limit = self.guard.limits.max_header_bytes
        self._refuse(431, f"request head exceeds the gateway limit of {limit} bytes")

    def _refuse(self, status: int, message: str) -> None:
        """Answer `status` unless a response already started, then close."""
        self.head_since = None
        started = self._in_request() and self._response_started()
        self._abandon_cycle()
        if started:
            self.transport.close()
        else:
            self._linger(error_response(status, message))

    def _linger(self, response: bytes) -> None:
        """Write `response`, half-close, and drop the connection once the client goes or
        `LINGER_S` passes (closing at once would reset it before the client reads)."""
        self.linger_since = self.guard.now
        transport = self.transport
        try:
            transport.write(response)
            if transport.can_write_eof():
                transport.write_eof()
            else:
                transport.close()
        except OSError:
            # The client already went (shutdown() says ENOTCONN): raised out of
            # connection_made this left the socket open for good, and a flood of
            # connect-and-reset leaked descriptors up to the limit.
            transport.abort()
            return
        if not self.counted:  # refused over the cap: not swept, so time it here
            guard = self.guard
            if guard.lingering >= MAX_LINGERING:  # a flood: free the descriptor now
                transport.close()
                return
            guard.lingering += 1
            self.loop.call_later(LINGER_S, self._close_if_open)

    def _close_if_open(self) -> None:
        self.guard.lingering -= 1
        if not self.transport.is_closing():
            self.transport.close()
