"""Graceful drain (P27): stop admitting, let requests in flight finish, then stop engines.

`DrainGate` wraps the gateway's ASGI app. It counts requests in flight; once `close()` is
called every new API request gets 503 with `Retry-After` (probes such as `/health` and
`/metrics` still answer), while requests already admitted run to completion. API requests
are everything under `/v1/` and every model-addressed path outside it (`/tokenize`,
`/pooling`, `/rerank`, ...: the gateway's `MODEL_PATHS`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from inferplane.gateway.app import MODEL_PATHS
from inferplane.gateway.asgi import Receive, Scope, Send
from inferplane.gateway.errors import openai_error

ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DEFAULT_GRACE_PERIOD_S = 300.0


class DrainGate:
    """ASGI middleware: admission switch plus an in-flight counter."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.in_flight = 0
        self.draining = False
        self._idle = asyncio.Event()
        self._idle.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not (
            scope["path"].startswith("/v1/") or scope["path"] in MODEL_PATHS
        ):
            await self.app(scope, receive, send)
            return
        if self.draining and scope["method"] == "POST":
            await _refuse(send)
            return
        self.in_flight += 1
        self._idle.clear()
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()

    def close(self) -> None:
        """Stop admitting new API requests (503 from now on)."""
        self.draining = True

    async def wait_idle(self, grace_period_s: float) -> bool:
        """Wait for requests in flight to finish; False if the grace period ran out first."""
        try:
            await asyncio.wait_for(self._idle.wait(), grace_period_s)
        except TimeoutError:
            return False
        return True


async def _refuse(send: Send) -> None:
    body = openai_error(
        "the fleet is shutting down; retry against another gateway", "service_unavailable", 503
    )
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(body)),
                (b"retry-after", b"5"),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
