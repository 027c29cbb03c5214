"""Abort a non-streamed generation when its client disconnects, as vLLM does.

vLLM's OpenAI server decorates its generate routes with `with_cancellation`
(vllm/entrypoints/utils.py): the handler runs as one task while `listen_for_disconnect`
awaits `request.receive()` for `http.disconnect`; whichever ends first cancels the other,
so a client that goes away (a gateway's timeout) aborts the engine request. Streams need
no help: Starlette's StreamingResponse already stops the generator on a disconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

T = TypeVar("T")


async def _disconnected(request: Request) -> None:
    # The body is already read, so the next ASGI message is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T | None:
    """`work`'s result, or None once the client has gone (`work` is then cancelled, so its
    own cleanup aborts the engine request and frees its blocks)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, watch):
            if not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pending
    return task.result() if not task.cancelled() else None
