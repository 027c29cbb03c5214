"""The shared deadline sweep of upstream exchanges (gateway/deadlines.py)."""

from __future__ import annotations

import asyncio

import pytest

from inferplane.gateway.deadlines import Deadline, Deadlines


async def _watched(deadlines: Deadlines, at_in_s: float, started: asyncio.Event) -> str:
    """Waits forever inside a watched span; what ended it, as the forwarder tells it."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    deadline = deadlines.start(loop, task, loop.time() + at_in_s)
    try:
        try:
            started.set()
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if not deadline.timed_out():
                raise
            raise TimeoutError from None
        finally:
            deadlines.end(deadline)
    except TimeoutError:
        return "timed out"
    return "returned"


async def test_a_past_deadline_is_a_timeout_and_the_cancel_is_withdrawn() -> None:
    deadlines = Deadlines(tick_s=0.001)
    task = asyncio.create_task(_watched(deadlines, 0.0, asyncio.Event()))
    assert await task == "timed out"
    assert task.cancelling() == 0  # nothing left to cancel the task later
    assert len(deadlines) == 0


async def test_another_cancel_stays_a_cancel_even_past_the_deadline() -> None:
    deadlines = Deadlines(tick_s=3600.0)  # the sweep runs only when called below
    started = asyncio.Event()
    task = asyncio.create_task(_watched(deadlines, 0.0, started))
    await started.wait()
    task.cancel()  # e.g. the client went away
    deadlines._sweep()  # and the deadline passed in the same loop iteration
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(deadlines) == 0


async def test_a_moved_deadline_is_what_the_sweep_reads() -> None:
    deadlines = Deadlines(tick_s=3600.0)
    started = asyncio.Event()
    task = asyncio.create_task(_watched(deadlines, 0.0, started))
    await started.wait()
    (deadline,) = deadlines._live
    deadline.at += 3600.0  # an idle deadline moved on by a relayed chunk
    deadlines._sweep()
    await asyncio.sleep(0)
    assert not task.done() and not deadline.expired
    deadline.at = 0.0
    deadlines._sweep()
    assert await task == "timed out"


async def test_a_deadline_not_expired_withdraws_nothing() -> None:
    task = asyncio.current_task()
    assert task is not None
    assert not Deadline(task, 0.0).timed_out()
    assert task.cancelling() == 0
