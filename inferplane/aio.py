"""Small asyncio helpers shared by the gateway, runtime, simulator and scaling loops."""

from __future__ import annotations

import asyncio
import contextlib
import os
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


def error_text(exc: BaseException) -> str:
    """A network call's exception in one line without the peer's address: aiohttp writes
    host and port into a connection error's text ("Cannot connect to host 10.0.0.5:8000
    ... Connect call failed ('10.0.0.5', 8000)"), and these lines reach clients (a 502, a
    stream's error event) through restart reasons and error messages."""
    cause = getattr(exc, "os_error", None)  # aiohttp.ClientConnectorError and subclasses
    if isinstance(cause, OSError):
        why = os.strerror(cause.errno) if cause.errno else type(cause).__name__
        return f"{type(exc).__name__}: {why}"
    if isinstance(exc, TimeoutError):
        return f"{type(exc).__name__}: timed out"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
