"""Background probes: engine `/metrics` for the engine-metrics scorer, and `/health` to
readmit replicas that passive health checking ejected."""

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

    async def read_engine(self, b: Backend) -> None:
        """Refresh `b.engine`; an unreadable or unusable endpoint clears the reading."""
        loop = asyncio.get_running_loop()
        try:
            async with self._session().get(b.url + _PATHS.metrics, timeout=_PROBE_TIMEOUT) as r:
                text = await r.text() if r.status == 200 else ""
        except (aiohttp.ClientError, TimeoutError, OSError):
            text = ""
        b.engine = parse_engine_load(text, loop.time()) if text else None

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

    async def probe_health_once(self) -> None:
        jobs = [
            self.check_health(pool, b)
            for pool in self.state.pools.values()
            for b in pool.backends
            if b.ejected
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
