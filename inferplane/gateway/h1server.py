"""Serving an ASGI app with the gateway's own protocol (`h1.py`): lifespan, listening,
graceful shutdown. The attributes callers use on a `uvicorn.Server` (`serve(sockets)`,
`run()`, `started`, `should_exit`, `force_exit`, `lifespan.shutdown()`) mean the same here,
so `gateway.server` picks either without changing its callers (`server.gateway_server`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Callable
from types import FrameType
from typing import Any

from inferplane.gateway.asgi import ASGIApp, Message
from inferplane.gateway.connections import Connections
from inferplane.gateway.h1 import protocol_for

_log = logging.getLogger("inferplane.gateway")


class StartupFailed(RuntimeError):
    """The app's lifespan startup reported a failure (or raised)."""


class Lifespan:
    """The ASGI lifespan protocol: startup before serving, shutdown after."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.state: dict[str, Any] = {}
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()
        self._started = asyncio.Event()
        self._stopped = asyncio.Event()
        self._failed: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._done = False

    async def startup(self) -> None:
        """Run the app's startup; raises `StartupFailed` when it reports a failure."""
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"},
                 "state": self.state}  # fmt: skip
        self._task = asyncio.get_running_loop().create_task(self._main(scope))
        await self._inbox.put({"type": "lifespan.startup"})
        await self._started.wait()
        if self._failed is not None:
            raise StartupFailed(f"the gateway's startup failed: {self._failed}")

    async def shutdown(self) -> None:
        if self._done or self._task is None or self._task.done():
            return
        self._done = True
        await self._inbox.put({"type": "lifespan.shutdown"})
        await self._stopped.wait()

    async def _main(self, scope: dict[str, Any]) -> None:
        try:
            await self.app(scope, self._inbox.get, self._send)
        except Exception as exc:  # the app's lifespan raised: startup failed
            _log.error("the gateway's lifespan raised", exc_info=exc)
            self._failed = self._failed or repr(exc)
        finally:
            self._started.set()
            self._stopped.set()

    async def _send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "lifespan.startup.complete":
            self._started.set()
        elif kind == "lifespan.startup.failed":
            self._failed = str(message.get("message", "")) or "startup failed"
            self._started.set()
        elif kind in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
            self._stopped.set()


class NativeServer:
    """The gateway's server on `h1.H1Protocol`, shaped like `uvicorn.Server`."""

    def __init__(
        self,
        app: ASGIApp,
        host: str,
        port: int,
        connections: Connections,
        backlog: int = 4096,
        timeout_graceful_shutdown: float | None = None,
        after_startup: Callable[[], None] | None = None,
    ) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.connections = connections
        self.backlog = backlog
        self.timeout_graceful_shutdown = timeout_graceful_shutdown
        self.lifespan = Lifespan(app)
        self.after_startup = after_startup  # run once the app's startup is done
        self.servers: list[asyncio.Server] = []
        self.started = False
        self.should_exit = False
        self.force_exit = False
        self._tasks: set[asyncio.Task[None]] = set()

    def run(self) -> None:
        """Serve on uvloop until SIGINT/SIGTERM (a second one: do not wait for answers)."""
        import uvloop

        try:
            uvloop.run(self._run_with_signals())
        except StartupFailed as exc:  # logged by the lifespan; exit as uvicorn does (3)
            _log.error("%s", exc)
            raise SystemExit(3) from None

    async def _run_with_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig, None)
        await self.serve()

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit:
            self.force_exit = True
        self.should_exit = True

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        await self.lifespan.startup()
        if self.after_startup is not None:
            self.after_startup()
        loop = asyncio.get_running_loop()
        if sockets:
            sock = sockets[0]
            name = sock.getsockname()
            proto = protocol_for(self.connections, self.app, (str(name[0]), int(name[1])))
            self._tasks = proto.tasks
            for s in sockets:
                self.servers.append(await loop.create_server(proto, sock=s, backlog=self.backlog))
        else:
            proto = protocol_for(self.connections, self.app, (self.host, self.port))
            self._tasks = proto.tasks
            self.servers.append(
                await loop.create_server(
                    proto, self.host, self.port, backlog=self.backlog, reuse_address=True
                )
            )
        self.started = True
        try:
            while not self.should_exit:
                await asyncio.sleep(0.1)
        finally:
            await self._shutdown()

    async def _shutdown(self) -> None:
        for server in self.servers:
            server.close()
        self.connections.drain()  # idle closed, slow ones 503, answers go on
        await asyncio.sleep(0.1)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.timeout_graceful_shutdown):
                while (self.connections.live or self._tasks) and not self.force_exit:
                    await asyncio.sleep(0.1)
        for task in list(self._tasks):
            task.cancel()
        for proto in list(self.connections.live):
            proto.transport.close()
        self.connections.close()
        if not self.force_exit:
            await self.lifespan.shutdown()
