"""The replicas of one model: candidate filtering, scorer chain, admission queue."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Sequence

from inferplane.gateway.admission import AdmissionQueue
from inferplane.gateway.backend import Backend, endpoint_backends
from inferplane.gateway.config import ModelRoute
from inferplane.gateway.scorers import (
    EngineMetricsScorer,
    LeastOutstanding,
    OnUnusable,
    PrefixAffinity,
    RouteContext,
    Scorer,
    SessionAffinity,
    pick_best,
)


class NoReplica(Exception):
    """No replica of the model is ready (-> 503)."""


def build_scorers(
    route: ModelRoute, stale_after_s: float, on_unusable: OnUnusable | None
) -> list[Scorer]:
    chain: list[Scorer] = []
    for name in route.scorers:
        if name == "least_outstanding":
            chain.append(LeastOutstanding(route.max_concurrency_per_replica))
        elif name == "engine_metrics":
            chain.append(EngineMetricsScorer(stale_after_s, on_unusable))
        elif name == "prefix_affinity":
            chain.append(PrefixAffinity(route.prefix_load_factor))
        elif name == "session_affinity":
            chain.append(SessionAffinity())
    if route.adapters and route.adapter_affinity:  # LoRA: replicas holding the adapter
        from inferplane.gateway.lora import AdapterAffinity

        chain.append(AdapterAffinity())
    return chain


class Pool:
    def __init__(
        self,
        route: ModelRoute,
        stale_after_s: float = 5.0,
        on_unusable: OnUnusable | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.route = route
        self.cap = route.max_concurrency_per_replica
        self.scorers = build_scorers(route, stale_after_s, on_unusable)
        self.uses_prefix = "prefix_affinity" in route.scorers
        self.uses_session = "session_affinity" in route.scorers
        self.uses_engine_metrics = "engine_metrics" in route.scorers
        self.session_header = route.session_header.lower().encode()
        adm = route.admission
        self.queue: AdmissionQueue[Backend] = AdmissionQueue(
            adm.max_queue_depth,
            adm.max_queue_wait_s,
            adm.interactive_head_start_s,
            on_abandoned=self.release,
            clock=clock,
        )
        self.backends: list[Backend] = []
        self._turn = 0
        # Scale from zero (inferplane.scaling): with no routable replica, `activator()`
        # True means one is starting or waking, so the request is held in the queue (its
        # depth and wait bounds apply) instead of a 503; `on_held` hears how long it was.
        self.activator: Callable[[], bool] | None = None
        self.on_held: Callable[[float], None] | None = None
        self.set_backends(endpoint_backends(route.name, route.endpoints))

    def set_backends(self, backends: Sequence[Backend]) -> None:
        """Replace the replica set. A URL already present keeps its live counters, so
        requests in flight release the same object they acquired."""
        current = {b.url: b for b in self.backends}
        merged: list[Backend] = []
        for new in backends:
            old = current.get(new.url)
            if old is not None:
                old.ready = new.ready
                old.max_concurrency = new.max_concurrency
                old.api_key = new.api_key
                old.label = new.label  # a new pod may reuse a gone pod's IP
                merged.append(old)
            else:
                merged.append(new)
        self.backends = merged
        urls = [b.url for b in merged]
        for scorer in self.scorers:
            if isinstance(scorer, PrefixAffinity | SessionAffinity):
                scorer.set_pool(urls)
        self.drain()

    def panic(self) -> bool:
        """Every ready replica is ejected: route to them anyway (Envoy's panic routing), so
        outlier detection alone never takes a model down."""
        ready = False
        for b in self.backends:
            if b.ready:
                if not b.ejected:
                    return False
                ready = True
        return ready

    def routable(self, b: Backend) -> bool:
        return (
            b.ready
            and (not b.ejected or self.panic())
            and (b.engine is None or b.engine.awake)
        )

    def any_routable(self) -> bool:
        return any(self.routable(b) for b in self.backends)

    def may_eject(self, b: Backend, *, keep_one: bool) -> bool:
        """Whether ejecting `b` stays within `max_ejection_percent` of the ready replicas
        (the first ejection always does); `keep_one`: never the last routable replica."""
        ready = [x for x in self.backends if x.ready]
        ejected = sum(1 for x in ready if x.ejected)
        if keep_one and len(ready) - ejected - (0 if b.ejected else 1) < 1:
            return False
        if ejected == 0:
            return True
        return (ejected + 1) * 100 <= self.route.max_ejection_percent * len(ready)

    def candidates(self, exclude: Collection[Backend] = ()) -> list[Backend]:
        cap = self.cap
        cands = [
            b
            for b in self.backends
            if b.ready
            and not b.ejected
            and b.outstanding < (b.max_concurrency or cap)
            and (b.engine is None or b.engine.awake)
            and b not in exclude
        ]
        if not cands and self.panic():
            cands = [
                b
                for b in self.backends
                if b.ready
                and b.outstanding < (b.max_concurrency or cap)
                and (b.engine is None or b.engine.awake)
                and b not in exclude
            ]
        return cands

    def try_acquire(self, ctx: RouteContext, exclude: Collection[Backend] = ()) -> Backend | None:
        """Reserve a slot on the best candidate now, or None when all are full/unready."""
        cands = self.candidates(exclude)
        if not cands:
            return None
        self._turn += 1
        b = pick_best(cands, self.scorers, ctx, self._turn)
        b.outstanding += 1
        return b

    async def acquire(self, ctx: RouteContext, priority: int) -> Backend:
        """A reserved replica; queues when all are at their cap. Raises NoReplica,
        QueueFull or QueueTimeout."""
        b = self.try_acquire(ctx)
        if b is not None:
            return b
        if not self.any_routable():
            if self.activator is None or not self.activator():
                raise NoReplica
            return await self._held(ctx, priority)
        return await self.queue.wait(priority, ctx)

    async def _held(self, ctx: RouteContext, priority: int) -> Backend:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            return await self.queue.wait(priority, ctx)
        finally:
            if self.on_held is not None:
                self.on_held(loop.time() - t0)

    def release(self, b: Backend) -> None:
        b.outstanding -= 1
        if len(self.queue):
            self.drain()

    def drain(self) -> None:
        """Hand free slots to queued requests, best waiter first."""
        queue = self.queue
        while (waiter := queue.head()) is not None:
            ctx = waiter.ctx if isinstance(waiter.ctx, RouteContext) else RouteContext()
            b = self.try_acquire(ctx)
            if b is None:
                return
            queue.grant(waiter, b)
