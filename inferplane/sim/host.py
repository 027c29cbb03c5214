"""Many simulated engines in one process: one uvicorn server per engine, one event loop.

    handles = await start_engines([SimEngineConfig(model="a"), SimEngineConfig(model="b")])
    handles[0].url          # "http://127.0.0.1:PORT"
    await handles[0].stop()

`EngineHost` does the same from synchronous code (its own loop in a background thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import TracebackType

import uvicorn

from inferplane.sim.app import EngineApp
from inferplane.sim.build import build_parts
from inferplane.sim.config import SimEngineConfig
from inferplane.sim.engine import SimEngine


class _QuietServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to whoever owns the process."""

    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[no-untyped-def]
        yield


@dataclass
class EngineHandle:
    """A running simulated engine. `crashed` is set when a crash fault fired, `died` when
    its engine core died (die_after_tokens: it still answers, /health 503)."""

    config: SimEngineConfig
    engine: SimEngine
    port: int
    host: str
    _server: uvicorn.Server
    _task: asyncio.Task[None]
    crashed: asyncio.Event = field(default_factory=asyncio.Event)
    died: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def stop(self) -> None:
        """Stop serving and stop the step loop (idempotent)."""
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self.engine.stop()


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # vLLM's server answers token by token; without TCP_NODELAY (which accepted sockets
    # inherit on Linux) a reused connection's first chunk waits for the client's delayed ACK
    # (~20-40 ms of false TTFT).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(2048)
    sock.setblocking(False)
    return sock


async def start_engine(config: SimEngineConfig) -> EngineHandle:
    """Build, bind and start one engine in the running loop; returns when it listens."""
    parts = build_parts(config)
    engine = SimEngine(parts)
    engine.start()
    holder: list[EngineHandle] = []

    def crash() -> None:
        # Stop listening like a dead process; requests in flight are dropped.
        handle = holder[0]
        handle.crashed.set()
        handle._server.should_exit = True
        handle._server.force_exit = True

    engine.on_death = lambda: holder[0].died.set()
    app = EngineApp(engine, on_crash=crash)
    sock = _bind(config.host, config.port)
    uv_config = uvicorn.Config(
        app.app, log_level="warning", access_log=False, lifespan="off",
        timeout_graceful_shutdown=1,
    )
    server = _QuietServer(uv_config)
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    handle = EngineHandle(config, engine, sock.getsockname()[1], config.host, server, task)
    holder.append(handle)
    while not server.started:
        if task.done():
            task.result()  # surfaces the start-up error
        await asyncio.sleep(0.005)
    return handle


async def start_engines(configs: Sequence[SimEngineConfig]) -> list[EngineHandle]:
    """Start every engine in the running loop (in order; ports are those bound)."""
    handles: list[EngineHandle] = []
    try:
        for config in configs:
            handles.append(await start_engine(config))
    except BaseException:
        await stop_engines(handles)
        raise
    return handles


async def stop_engines(handles: Sequence[EngineHandle]) -> None:
    await asyncio.gather(*(handle.stop() for handle in handles))


class EngineHost:
    """Engines on a private event loop in a daemon thread, for synchronous callers.

        with EngineHost([SimEngineConfig(model="m")]) as handles:
            openai.OpenAI(base_url=handles[0].url + "/v1", api_key="x")
    """

    def __init__(self, configs: Sequence[SimEngineConfig]) -> None:
        self.configs = list(configs)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.handles: list[EngineHandle] = []

    def start(self) -> list[EngineHandle]:
        self._thread.start()
        future: Future[list[EngineHandle]] = asyncio.run_coroutine_threadsafe(
            start_engines(self.configs), self.loop
        )
        self.handles = future.result(timeout=60)
        return self.handles

    def stop(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(stop_engines(self.handles), self.loop).result(30)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
        self.loop.close()

    def __enter__(self) -> list[EngineHandle]:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
