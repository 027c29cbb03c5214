"""Client connections bounded in time, size and number, as nginx bounds them.

uvicorn's httptools protocol never times out a connection that sends its request head or
body slowly (or nothing at all), accepts request heads of any size and any number of
connections. `GuardedProtocol` adds, per `ConnectionLimits` (docs/gateway.md lists each
next to nginx's equivalent):

- the request head must be complete within `header_timeout_s` of the connection opening or
  of its first byte (a keep-alive connection's next request) -> 408 and closed;
- no gap between two reads of a request body may exceed `body_timeout_s` -> 408, closed;
- the whole body must arrive within `body_total_timeout_s` of the head -> 408, closed (a
  byte every few seconds keeps every gap short and would hold the connection forever);
- an idle keep-alive connection is closed after `keepalive_timeout_s` (uvicorn's timer);
- a client that reads nothing of its response for `send_timeout_s` is dropped;
- a request head above `max_header_bytes` gets 431 and the connection is closed;
- beyond `max_connections` open connections (and never closer to the process's descriptor
  limit than `fd_reserve`; each client connection may hold an upstream one) a new
  connection gets 503 and is closed; at most `MAX_LINGERING` refused connections linger
  for the client to read their 503, the rest are closed at once, so a flood of
  connections never takes the process to its descriptor limit (where every accept()
  fails and asyncio logs a traceback for each);
- `drain()` closes idle connections at once, answers 503 to those still sending a request
  head or body, and lets those being answered finish and then close.

On asyncio's own event loop (the runtime of `inferplane up`; `inferplane gateway` runs on
uvloop, whose libuv accepts one connection per callback and sheds at the limit itself),
the listening socket is a `Listener`: asyncio accepts up to its server's `backlog`
connections per loop tick before any of them reaches `connection_made` (where the cap is
applied), and at EMFILE it goes on trying the rest of that batch, logging and scheduling a
retry for each (16,009 tracebacks in two seconds). A `Listener` keeps the kernel's queue at
`LISTEN_BACKLOG` while the server is given `ACCEPT_BATCH` as its backlog, and after one
EMFILE ends the batch, so the accepts of one tick stay few and a flood waits in the
kernel's queue, where it costs no descriptor.

Every connection also gets TCP_NODELAY: the gateway writes whole responses, so Nagle's
algorithm only adds a delayed-ACK wait (~40 ms) to small answers on reused connections.

Timers are one sweep over the open connections a few times per timeout, not one timer per
request: the hot path only counts head bytes and copies the sweep's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import resource
import socket
import time
from collections.abc import Callable
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from inferplane.gateway.config import ConnectionLimits
from inferplane.gateway.errors import error_body

CONNECTION = "inferplane.connection"  # scope key: the request's GuardedProtocol
LINGER_S = 2.0  # how long a refused connection may keep sending before it is closed
MAX_LINGERING = 64  # refused connections waiting out LINGER_S; beyond: closed at once
_PHRASES = {408: b"Request Timeout", 431: b"Request Header Fields Too Large",
            503: b"Service Unavailable"}  # fmt: skip


LISTEN_BACKLOG = 4096  # the kernel's queue of connections not yet accepted
ACCEPT_BATCH = 32  # connections asyncio accepts per loop tick from a `Listener`
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class Listener(socket.socket):
    """A listening socket for asyncio's loop (see the module docstring): `listen()` keeps
    the kernel's queue long whatever backlog the server passes; after an EMFILE, `accept()`
    says "nothing waiting" for the rest of asyncio's batch (asyncio has already paused the
    listener for a second and logged the error once)."""

    quiet_until = 0.0  # monotonic time: accept() reports an empty queue until then

    def listen(self, backlog: int = LISTEN_BACKLOG) -> None:
        super().listen(max(backlog, LISTEN_BACKLOG))

    def accept(self) -> tuple[socket.socket, Any]:
        if self.quiet_until and time.monotonic() < self.quiet_until:
            raise BlockingIOError(errno.EAGAIN, "paused after running out of descriptors")
        try:
            return super().accept()
        except OSError as exc:
            if exc.errno in _OUT_OF_RESOURCES:
                self.quiet_until = time.monotonic() + 0.5  # asyncio retries after 1 s
            raise


def listener(host: str, port: int) -> Listener:
    """A bound, listening, non-blocking `Listener` (SO_REUSEADDR). Serve it with the
    `uvicorn_config(..., backlog=ACCEPT_BATCH)` of `inferplane.gateway.server`."""
    sock = Listener(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def raise_nofile_soft_limit() -> int:
    """Raise the soft descriptor limit to the hard one (P30); the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class Connections:
    """The open client connections of one gateway, and what was refused or timed out."""

    def __init__(self, limits: ConnectionLimits | None = None) -> None:
        self.limits = limits or ConnectionLimits()
        self.live: set[GuardedProtocol] = set()
        self.refused = 0  # over the connection cap
        self.timed_out: dict[str, int] = {"header": 0, "body": 0, "send": 0}
        self.too_large = 0  # 431s
        self.lingering = 0  # refused over the cap, still open for LINGER_S
        self._timer: asyncio.TimerHandle | None = None
        self.now = 0.0  # loop time of the last sweep (or connection): the protocols' clock
        self._cap = self._compute_cap()
        lim = self.limits
        shortest = min(lim.header_timeout_s, lim.body_timeout_s, lim.send_timeout_s, LINGER_S)
        self.sweep_s = max(0.02, min(1.0, shortest / 4))

    @property
    def cap(self) -> int:
        """Open connections allowed now: the configured cap, or fewer when the descriptor
        limit (minus the reserve, halved since each may hold an upstream) is lower."""
        return self._cap

    def _compute_cap(self) -> int:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY:
            return self.limits.max_connections
        return max(1, min(self.limits.max_connections, (soft - self.limits.fd_reserve) // 2))

    def admit(self, proto: GuardedProtocol) -> bool:
        if self._timer is None:  # the first connection after a quiet spell: limits anew
            self._cap = self._compute_cap()
        if len(self.live) >= self._cap:
            self.refused += 1
            return False
        self.live.add(proto)
        if self._timer is None:
            self._timer = proto.loop.call_later(self.sweep_s, self._sweep, proto.loop)
        return True

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        self.now = now = loop.time()
        self._cap = self._compute_cap()
        for proto in list(self.live):
            proto.check(now)
        if self.live:
            self._timer = loop.call_later(self.sweep_s, self._sweep, loop)

    def drain(self) -> None:
        """Shutting down: close idle and slow connections now; let answers finish."""
        for proto in list(self.live):
            proto.drain()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class ConnectionsCollector(Collector):
    """`/metrics` for client connections, read at scrape time (nothing per request)."""

    def __init__(self, connections: Connections) -> None:
        self.connections = connections

    def collect(self) -> Any:
        c = self.connections
        yield GaugeMetricFamily(
            "inferplane_client_connections", "Open client connections", value=len(c.live)
        )
        yield GaugeMetricFamily(
            "inferplane_client_connections_cap",
            "Client connections allowed (max_connections, or less near the fd limit)",
            value=c.cap,
        )
        refused = CounterMetricFamily(
            "inferplane_client_connections_refused",
            "Client connections refused with 503 at the cap",
        )
        refused.add_metric([], c.refused)
        yield refused
        closed = CounterMetricFamily(
            "inferplane_client_connections_closed",
            "Client connections closed by a bound: header/body/send timeout, head too large",
            labels=["reason"],
        )
        for reason, count in c.timed_out.items():
            closed.add_metric([f"{reason}_timeout"], count)
        closed.add_metric(["head_too_large"], c.too_large)
        yield closed


def _error_response(status: int, message: str, extra: bytes = b"") -> bytes:
    body = error_body(status, message)
    return b"".join((
        b"HTTP/1.1 %d %s\r\n" % (status, _PHRASES[status]),
        b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body),
        extra, b"connection: close\r\n\r\n", body,
    ))  # fmt: skip


_REFUSED = _error_response(
    503, "the gateway is at its connection limit; retry later", b"retry-after: 1\r\n"
)


class _HeadTooLarge(Exception):
    """Raised from a parser callback to stop parsing a request head above the limit."""


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the bounds above. `guard` is set per gateway by
    `protocol_for`.

    Cheap on the hot path: two overridden callbacks per request (`data_received`,
    `on_headers_complete`), no timers and no clock reads (times come from the sweep's
    clock, `guard.now`). Which phase a connection is in follows from uvicorn's own state:
    `head_since` is set while a request head is awaited or arriving; a request cycle with
    `more_body` is receiving its body; any other open cycle is being answered.
    """

    guard: Connections

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.head_since: float | None = None  # a head is awaited/arriving since then
        self.head_bytes = 0  # bytes received for the head in progress
        self.body_at = 0.0  # last read of the request body in progress
        self.body_since = 0.0  # the head of the request whose body is arriving ended then
        self.paused_since: float | None = None  # the client stopped reading its answer
        self.linger_since: float | None = None  # answered with an error, half-closed
        self.too_big = False
        self.counted = False  # in `guard.live`
        self.on_lost: Callable[[], None] | None = None  # the request in flight: client gone

    # ---- connection --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError, AttributeError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        guard = self.guard
        guard.now = self.loop.time()
        if not guard.admit(self):
            self.transport = transport
            self._linger(_REFUSED)
            return
        self.counted = True
        self.head_since = guard.now  # the first head is timed from the connection's opening
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.counted:
            self.guard.live.discard(self)
            self.counted = False
        super().connection_lost(exc)
        on_lost, self.on_lost = self.on_lost, None
        if on_lost is not None:
            on_lost()

    def data_received(self, data: bytes) -> None:
        if self.linger_since is not None:
            return  # refused: read and drop what the client still sends
        cycle = self.cycle
        if cycle is None or cycle.response_complete:  # between requests: a request head
            if self.head_since is None:
                self.head_since = self.guard.now
                self.head_bytes = 0
            self.head_bytes += len(data)
        elif cycle.more_body:
            self.body_at = self.guard.now  # the body timeout is a gap between reads
        super().data_received(data)
        if (
            self.head_since is not None
            and self.head_bytes > self.guard.limits.max_header_bytes
            and self.linger_since is None
        ):
            self._too_large()  # still no complete head, and already too much of it

    def on_headers_complete(self) -> None:
        self.head_since = None
        limit = self.guard.limits.max_header_bytes
        if self.head_bytes > limit and self._head_size() > limit:
            self.too_big = True
            raise _HeadTooLarge  # uvicorn answers parser errors with send_400_response
        self.body_at = self.body_since = self.guard.now
        super().on_headers_complete()
        # The request path learns of a client gone from `on_lost`, without a task
        # waiting on receive() per request (app.py, issue 29).
        self.scope[CONNECTION] = self  # type: ignore[literal-required]

    def _head_size(self) -> int:
        return len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers)

    def send_400_response(self, msg: str) -> None:
        if self.too_big:
            self.head_since = None
            self._too_large()
        else:
            super().send_400_response(msg)

    def pause_writing(self) -> None:
        self.paused_since = self.guard.now
        super().pause_writing()

    def resume_writing(self) -> None:
        self.paused_since = None
        super().resume_writing()

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
        cycle = self.cycle
        if self.head_since is not None:
            if now - self.head_since > lim.header_timeout_s:
                self.guard.timed_out["header"] += 1
                if self.head_bytes == 0:
                    transport.close()  # never sent a byte of it: nothing to answer
                else:
                    msg = f"request head not received within {lim.header_timeout_s:g} s"
                    self._refuse(408, msg)
        elif cycle is not None and not cycle.response_complete:
            if cycle.more_body:
                if now - self.body_at > lim.body_timeout_s:
                    self.guard.timed_out["body"] += 1
                    self._refuse(408, f"no request body data for {lim.body_timeout_s:g} s")
                elif now - self.body_since > lim.body_total_timeout_s:
                    self.guard.timed_out["body"] += 1
                    self._refuse(408, "request body not received within "
                                 f"{lim.body_total_timeout_s:g} s")  # fmt: skip
            elif self.paused_since is not None and now - self.paused_since > lim.send_timeout_s:
                self.guard.timed_out["send"] += 1
                self._abandon_cycle()
                transport.close()

    def drain(self) -> None:
        """The gateway is shutting down (`Connections.drain`, uvicorn's `shutdown`)."""
        transport = self.transport
        if transport is None or transport.is_closing() or self.linger_since is not None:
            return
        cycle = self.cycle
        if self.head_since is not None and self.head_bytes:
            self._refuse(503, "the gateway is shutting down; retry against another one")
        elif cycle is None or cycle.response_complete:
            transport.close()  # idle
        elif cycle.more_body:
            self._refuse(503, "the gateway is shutting down; retry against another one")
        else:
            cycle.keep_alive = False  # close once this answer is sent

    def shutdown(self) -> None:
        self.drain()

    def _too_large(self) -> None:
        self.guard.too_large += 1
        limit = self.guard.limits.max_header_bytes
        self._refuse(431, f"request head exceeds the gateway limit of {limit} bytes")

    def _refuse(self, status: int, message: str) -> None:
        """Answer `status` unless a response already started, then close."""
        self.head_since = None
        cycle = self.cycle  # a finished cycle is the previous request's: not this one
        started = cycle is not None and not cycle.response_complete and cycle.response_started
        self._abandon_cycle()
        if started:
            self.transport.close()
        else:
            self._linger(_error_response(status, message))

    def _abandon_cycle(self) -> None:
        """The request in progress sees a disconnect (its receive() returns at once)."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()

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


def protocol_for(connections: Connections) -> type[GuardedProtocol]:
    """A protocol class bound to one gateway's `Connections` (uvicorn's `http=`)."""
    return type("GatewayProtocol", (GuardedProtocol,), {"guard": connections})
