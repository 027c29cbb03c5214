"""Client connections bounded in time, size and number, as nginx bounds them.

uvicorn's httptools protocol never times out a connection that sends its request head or
body slowly (or nothing at all), accepts request heads of any size and any number of
connections. Both of the gateway's server protocols, `GuardedProtocol` here (uvicorn's,
bounded) and `h1.H1Protocol` (the gateway's own), mix in `bounds.Bounded`, which enforces,
per `ConnectionLimits` (docs/gateway.md lists each next to nginx's equivalent):

- the request head must be complete within `header_timeout_s` of the connection opening or
  of its first byte (a keep-alive connection's next request) -> 408 and closed;
- no gap between two reads of a request body may exceed `body_timeout_s` -> 408, closed;
- the whole body must arrive within `body_total_timeout_s` of the head -> 408, closed (a
  byte every few seconds keeps every gap short and would hold the connection forever);
- an idle keep-alive connection is closed after `keepalive_timeout_s` (uvicorn's timer on
  uvicorn's protocol, the sweep on the gateway's own);
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
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from inferplane.gateway.bounds import LINGER_S, MAX_LINGERING, Bounded, HeadTooLarge
from inferplane.gateway.config import ConnectionLimits

__all__ = ["ACCEPT_BATCH", "CONNECTION", "LINGER_S", "MAX_LINGERING", "Connections",
           "ConnectionsCollector", "GuardedProtocol", "Listener", "listener", "protocol_for",
           "raise_nofile_soft_limit"]  # fmt: skip

CONNECTION = "inferplane.connection"  # scope key: the request's protocol (a `Bounded`)


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
        self.live: set[Bounded] = set()
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

    def admit(self, proto: Bounded) -> bool:
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


class GuardedProtocol(Bounded, HttpToolsProtocol):
    """uvicorn's httptools protocol with the bounds above (`bounds.Bounded`). `guard` is
    set per gateway by `protocol_for`.

    Cheap on the hot path: two overridden callbacks per request (`data_received`,
    `on_headers_complete`), no timers and no clock reads (times come from the sweep's
    clock, `guard.now`). Which phase a connection is in follows from uvicorn's own state:
    `head_since` is set while a request head is awaited or arriving; a request cycle with
    `more_body` is receiving its body; any other open cycle is being answered.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._init_bounds()

    # ---- the phase, from uvicorn's cycle -----------------------------------------------

    def _in_request(self) -> bool:
        cycle = self.cycle
        return cycle is not None and not cycle.response_complete

    def _receiving_body(self) -> bool:
        cycle = self.cycle
        return cycle is not None and not cycle.response_complete and cycle.more_body

    def _response_started(self) -> bool:
        return self.cycle is not None and self.cycle.response_started

    def _abandon_cycle(self) -> None:
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()

    def _close_after_answer(self) -> None:
        if self.cycle is not None:
            self.cycle.keep_alive = False  # close once this answer is sent

    # ---- connection --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if self._open(transport):
            super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._gone()

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
            raise HeadTooLarge  # uvicorn answers parser errors with send_400_response
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

    def drain(self) -> None:  # (uvicorn's own "drain" is the flow control's, not this)
        Bounded.drain(self)

    def shutdown(self) -> None:
        self.drain()


def protocol_for(connections: Connections) -> type[GuardedProtocol]:
    """A protocol class bound to one gateway's `Connections` (uvicorn's `http=`)."""
    return type("GatewayProtocol", (GuardedProtocol,), {"guard": connections})
