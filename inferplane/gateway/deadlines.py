"""Deadlines of the upstream exchanges in flight, enforced by one shared sweep.

`asyncio.timeout_at` costs a `Timeout` object, a `current_task()` lookup and a loop timer
per request, and `reschedule` (each relayed stream chunk moves the idle deadline) cancels
that timer and makes a new one. Here a request's deadline is a float on a small object in
a set; a sweep every `TICK_S` while any exchange is in flight cancels the task of each one
past its deadline, which the forwarder turns into the same `TimeoutError` handling
`asyncio.timeout` gave it. A deadline fires at most one tick late (5 ms; longer only with
more than 5,000 exchanges in flight, see `_TICK_PER_ENTRY_S`).
"""

from __future__ import annotations

import asyncio
from typing import Any

# How late a deadline may fire; the upstream timeouts are seconds, the loop's clock is ms.
TICK_S = 0.005
# With many exchanges in flight the sweep runs less often, so that it stays near 1% of a
# core (~11 ns an entry measured): 5 ms up to 5,000 in flight, 10 ms at 10,000.
_TICK_PER_ENTRY_S = 1e-6


class Deadline:
    """One exchange's deadline; move it by setting `at` (the loop's clock)."""

    __slots__ = ("_cancelling", "at", "expired", "task")

    def __init__(self, task: asyncio.Task[Any], at: float) -> None:
        self.task = task
        self.at = at
        self.expired = False  # the sweep cancelled the task for it
        self._cancelling = task.cancelling()

    def timed_out(self) -> bool:
        """After a CancelledError in the span: whether it was this deadline's own and
        nobody else's (then its cancel request is withdrawn), as `asyncio.Timeout` does."""
        if not self.expired:
            return False
        self.expired = False  # withdrawn once
        return self.task.uncancel() <= self._cancelling


class Deadlines:
    """The set of deadlines in flight and the sweep that runs while it is not empty."""

    def __init__(self, tick_s: float = TICK_S) -> None:
        self._tick = tick_s
        self._live: set[Deadline] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._live)

    def start(
        self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any], at: float
    ) -> Deadline:
        """Watch `task` until `end`: past `at`, it is cancelled."""
        deadline = Deadline(task, at)
        self._live.add(deadline)
        if self._handle is None or self._loop is not loop:
            self._loop = loop
            self._handle = loop.call_at(loop.time() + self._tick, self._sweep)
        return deadline

    def end(self, deadline: Deadline) -> None:
        """The span is over: no cancel from now on (an unconsumed one is withdrawn)."""
        self._live.discard(deadline)
        if deadline.expired:
            deadline.timed_out()

    def _sweep(self) -> None:
        loop = self._loop
        assert loop is not None
        if not self._live:
            self._handle = None
            return
        now = loop.time()
        for deadline in self._live:
            if deadline.at <= now and not deadline.expired:
                deadline.expired = True
                deadline.task.cancel()  # only scheduled: the set does not change here
        tick = max(self._tick, len(self._live) * _TICK_PER_ENTRY_S)
        self._handle = loop.call_at(now + tick, self._sweep)
