"""Background probes: engine `/metrics` for the engine-metrics scorer, and `/health` of
every ready replica: an ejected one is readmitted once it answers 200; a routed one whose
`/health` gets no answer at all (a timeout or a refused connection: the process is hung,
stopped or gone) `HUNG_AFTER` times in a row is reported to `on_hung`, which ejects it
and ends its requests. The default timeouts are long (a generation may take minutes), so
without this a hung endpoint replica held every request sent to it for up to an hour.
An answer with any status counts as alive: what it says is the engine's business."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp

from inferplane.aio import cancel_and_wait
from inferplane.engines import engine_for
from inferplane.gateway.backend import Backend
from inferplane.gateway.engine_metrics import parse_engine_load
from inferplane.gateway.pool import Pool
from inferplane.gateway.state import GatewayState

_PROBE_TIMEOUT = aiohttp.ClientTimeout(total=2.0)
# The engines behind the gateway all answer vLLM's paths (the simulator too).
_PATHS = engine_for("vllm").endpoints
HUNG_AFTER = 2  # probes in a row without an answer


class Monitor:
    def __init__(
        self,
        state: GatewayState,
        session: Callable[[], aiohttp.ClientSession],
        metrics_interval_s: float,
        health_interval_s: float,
    ) -> None:
        self.state = state
        self._session = session
        self.metrics_interval_s = metrics_interval_s
        self.health_interval_s = health_interval_s
        self._tasks: list[asyncio.Task[None]] = []
        # Called with (pool, backend) for a routed replica that stopped answering /health.
        self.on_hung: Callable[[Pool, Backend], None] | None = None

    async def read_engine(self, b: Backend) -> None:
        """Refresh `b.engine`; an unreadable or unusable endpoint clears the reading."""
        loop = asyncio.get_running_loop()
        try:
            async with self._session().get(b.url + _PATHS.metrics, timeout=_PROBE_TIMEOUT) as r:
                text = await r.text() if r.status == 200 else ""
        except (aiohttp.ClientError, TimeoutError, OSError):
            text = ""
        b.engine = parse_engine_load(text, loop.time()) if text else None

    async def alive(self, b: Backend) -> bool:
        """Whether the replica's `/health` answers 200 within the probe timeout."""
        try:
            async with self._session().get(b.url + _PATHS.health, timeout=_PROBE_TIMEOUT) as r:
                return r.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    async def check_health(self, pool: Pool, b: Backend) -> None:
        """Readmit an ejected replica once its `/health` answers 200."""
        try:
            async with self._session().get(b.url + _PATHS.health, timeout=_PROBE_TIMEOUT) as r:
                healthy = r.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            healthy = False
        if healthy and b.ejected:
            b.ejected = False
            b.consecutive_failures = b.consecutive_5xx = 0
            pool.drain()

    async def probe_metrics_once(self) -> None:
        jobs = [
            self.read_engine(b)
            for pool in self.state.pools.values()
            if pool.uses_engine_metrics
            for b in pool.backends
            if b.ready
        ]
        if jobs:
            await asyncio.gather(*jobs)

    async def check_answers(self, pool: Pool, b: Backend) -> None:
        """Count a routed replica's /health probes that got no answer at all."""
        try:
            async with self._session().get(b.url + _PATHS.health, timeout=_PROBE_TIMEOUT) as r:
                await r.read()
            b.health_failures = 0
            return
        except (aiohttp.ClientError, TimeoutError, OSError):
            b.health_failures += 1
        if b.health_failures >= HUNG_AFTER and not b.ejected and self.on_hung is not None:
            b.health_failures = 0
            self.on_hung(pool, b)

    async def probe_health_once(self) -> None:
        jobs = [
            self.check_health(pool, b) if b.ejected else self.check_answers(pool, b)
            for pool in self.state.pools.values()
            for b in pool.backends
            if b.ejected or (b.ready and self.on_hung is not None)
        ]
        if jobs:
            await asyncio.gather(*jobs)

    async def _every(self, interval: float, job: Callable[[], object]) -> None:
        while True:
            await asyncio.sleep(interval)
            result = job()
            if asyncio.iscoroutine(result):
                await result

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        if any(p.uses_engine_metrics for p in self.state.pools.values()):
            self._tasks.append(
                loop.create_task(self._every(self.metrics_interval_s, self.probe_metrics_once))
            )
        self._tasks.append(
            loop.create_task(self._every(self.health_interval_s, self.probe_health_once))
        )

    async def stop(self) -> None:
        await cancel_and_wait(*self._tasks)
        self._tasks.clear()
