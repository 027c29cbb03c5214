"""Small asyncio helpers shared by the gateway, runtime, simulator and scaling loops."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel every task, then wait for each to finish (a background loop's stop()).

    All are cancelled before any is awaited, so they wind down together; their
    CancelledError is expected and swallowed."""
    live = [task for task in tasks if task is not None]
    for task in live:
        task.cancel()
    for task in live:
        with contextlib.suppress(asyncio.CancelledError):
            await task
