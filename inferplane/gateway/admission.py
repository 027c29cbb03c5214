"""Per-model admission queue: bounded depth, bounded wait, priority without starvation (P37).

A request waits here only when every ready replica is at its concurrency cap. Waiters are
ordered by `arrival - head_start` where interactive requests get `head_start` seconds and
batch ones none: interactive goes first, yet a batch request that has waited longer than
the head start overtakes newly arriving interactive ones, so no class starves.

The queue does not pick replicas: the pool calls `grant` with a reserved replica when one
frees up, which hands the slot straight to the head waiter (no thundering herd).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

INTERACTIVE = 0
BATCH = 1


class QueueFull(Exception):
    """The model's queue is at its depth limit (-> 429)."""


class QueueTimeout(Exception):
    """The request waited longer than the model's queue wait limit (-> 503)."""


class Waiter(Generic[T]):
    __slots__ = ("ctx", "future", "key", "seq")

    def __init__(self, key: float, seq: int, future: asyncio.Future[T], ctx: object) -> None:
        self.key = key
        self.seq = seq
        self.future = future
        self.ctx = ctx

    def __lt__(self, other: Waiter[T]) -> bool:
        return (self.key, self.seq) < (other.key, other.seq)


class AdmissionQueue(Generic[T]):
    def __init__(
        self,
        max_depth: int,
        max_wait_s: float,
        head_start_s: float,
        on_abandoned: Callable[[T], None],
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.max_depth = max_depth
        self.max_wait_s = max_wait_s
        self.head_start_s = head_start_s
        self._on_abandoned = on_abandoned  # gets slots granted to waiters that then left
        self._clock = clock
        self._heap: list[Waiter[T]] = []
        self._live = 0  # waiters not yet granted, timed out or cancelled
        self._seq = itertools.count()

    def __len__(self) -> int:
        return self._live

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    async def wait(self, priority: int, ctx: object = None) -> T:
        """Wait for a slot; returns what `grant` handed over. Raises QueueFull/QueueTimeout."""
        if self._live >= self.max_depth:
            raise QueueFull
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        key = self._now() - (self.head_start_s if priority == INTERACTIVE else 0.0)
        waiter = Waiter(key, next(self._seq), future, ctx)
        heapq.heappush(self._heap, waiter)
        self._live += 1
        timer = loop.call_later(self.max_wait_s, self._expire, waiter)
        try:
            return await future
        except asyncio.CancelledError:
            if future.cancelled():
                self._live -= 1  # still pending when we left; head() drops it later
            elif future.exception() is None:
                self._on_abandoned(future.result())  # granted in the tick we were cancelled
            raise
        finally:
            timer.cancel()

    def _expire(self, waiter: Waiter[T]) -> None:
        if not waiter.future.done():
            self._live -= 1
            waiter.future.set_exception(QueueTimeout())

    def head(self) -> Waiter[T] | None:
        """The next waiter to serve, dropping finished ones."""
        heap = self._heap
        while heap and heap[0].future.done():
            heapq.heappop(heap)
        return heap[0] if heap else None

    def grant(self, waiter: Waiter[T], slot: T) -> None:
        """Hand `slot` to `waiter`, which must be the current `head()`."""
        heapq.heappop(self._heap)
        self._live -= 1
        waiter.future.set_result(slot)
