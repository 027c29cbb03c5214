"""Passive health: what the request path learns about replicas from its own traffic.

A replica that cannot be reached, dies mid-stream or times out is the replica's failure
(eject after `eject_after_failures` in a row, ending what is in flight on it); a 5xx answer
counts only when another replica shows the request itself works (`eject_after_5xx`, never
the model's last routable replica). The monitor readmits ejected replicas.
"""

from __future__ import annotations

import asyncio

from inferplane.gateway.backend import Backend
from inferplane.gateway.metrics import GatewayMetrics
from inferplane.gateway.monitor import Monitor
from inferplane.gateway.pool import Pool
from inferplane.gateway.upstream import UpstreamClient


class PassiveHealth:
    def __init__(self, metrics: GatewayMetrics, upstream: UpstreamClient, monitor: Monitor) -> None:
        self.metrics = metrics
        self.upstream = upstream
        self.monitor = monitor
        self._probes: set[asyncio.Task[None]] = set()  # health checks after a total timeout

    def failure(self, pool: Pool, backend: Backend, why: str) -> None:
        """The replica's own failure (no connection, reset, death mid-stream, timeout):
        eject after `eject_after_failures` in a row, and end what is in flight on it."""
        backend.consecutive_failures += 1
        if backend.consecutive_failures >= pool.route.eject_after_failures:
            self.eject(pool, backend, why, keep_one=False)

    def hung(self, pool: Pool, backend: Backend) -> None:
        """The monitor's /health probes got no answer: eject it, end its requests."""
        self.eject(pool, backend, f"{backend.public} stopped answering /health", keep_one=False)

    def confirm_hung(self, pool: Pool, backend: Backend) -> None:
        """Count a total-deadline timeout as the replica's failure only once its /health
        fails too (probed in the background: the client has its 504 at once)."""

        async def probe() -> None:
            if not await self.monitor.alive(backend):
                self.failure(pool, backend, f"{backend.public} timed out")

        task = asyncio.get_running_loop().create_task(probe())
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    def error_5xx(self, pool: Pool, backend: Backend) -> None:
        """A 5xx answer not shown to be the request's own: eject after `eject_after_5xx`
        in a row, but never the model's last routable replica."""
        backend.consecutive_5xx += 1
        if backend.consecutive_5xx >= pool.route.eject_after_5xx:
            why = f"{backend.consecutive_5xx} consecutive 5xx answers"
            self.eject(pool, backend, why, keep_one=True, end_in_flight=False)

    def eject(
        self, pool: Pool, backend: Backend, why: str, *, keep_one: bool,
        end_in_flight: bool = True,
    ) -> None:  # fmt: skip
        """Stop routing to the replica until the monitor readmits it."""
        if backend.ejected:
            return
        if not pool.may_eject(backend, keep_one=keep_one):
            self.metrics.ejections_refused.labels(pool.route.name, backend.label).inc()
            return
        backend.ejected = True
        self.metrics.ejections.labels(pool.route.name, backend.label).inc()
        if end_in_flight:  # a hung or dying replica: its streams would only wait
            self.upstream.abort(backend.url, f"replica ejected ({why})")

    @staticmethod
    def succeeded(backend: Backend) -> None:
        """A good answer ends both runs of failures."""
        backend.consecutive_failures = backend.consecutive_5xx = 0
