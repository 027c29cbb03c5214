"""Scale from zero behind a Kubernetes Service: the gateway holds, KEDA activates.

In the cluster the gateway routes each model to its Service, a backend that looks ready
even with no pod behind it. For the models with `min_replicas: 0` this activator probes
the Service's `/health` every `interval_s`: while nothing answers, the backend is not
ready, so a request is held in the model's admission queue (the pool's activator says
yes) instead of failing - and `inferplane_queue_depth{model}` rises, which is what the
rendered ScaledObject's `held` trigger activates the workload on (docs/scaling.md). Once
a pod answers, the backend is ready again and the held requests go to it.

    app = build_app(config, tenancy)
    asgi = with_zero_activation(app, ["night-batch"])   # then serve `asgi`
"""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping, Sequence
from typing import Any

from inferplane.aio import cancel_and_wait
from inferplane.engines import engine_for
from inferplane.gateway.app import GatewayApp
from inferplane.gateway.asgi import Receive, Scope, Send

# The engines behind the gateway answer vLLM's paths (the simulator too).
_HEALTH = engine_for("vllm").endpoints.health


class ZeroActivator:
    def __init__(self, app: GatewayApp, models: Sequence[str], interval_s: float = 0.5,
                 timeout_s: float = 1.0) -> None:
        self.app = app
        self.models = [m for m in models if m in app.state.pools]
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._task: asyncio.Task[None] | None = None
        for model in self.models:
            app.state.pools[model].activator = lambda: True  # held while nothing answers

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def probe_once(self) -> None:
        import aiohttp

        session = self.app.session()
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)

        async def one(model: str) -> None:
            pool = self.app.state.pools[model]
            changed = False
            for b in pool.backends:
                try:
                    async with session.get(b.url + _HEALTH, timeout=timeout) as resp:
                        ok = resp.status == 200
                except (aiohttp.ClientError, TimeoutError, OSError):
                    ok = False
                if ok != b.ready:
                    b.ready = ok
                    changed = True
            if changed:
                pool.set_backends(list(pool.backends))  # hands free slots to held requests

        await asyncio.gather(*(one(m) for m in self.models))

    async def _run(self) -> None:
        while True:
            await self.probe_once()
            await asyncio.sleep(self.interval_s)


class ActivatingApp:
    """The gateway app with the activator started and stopped by the ASGI lifespan."""

    def __init__(self, app: GatewayApp, activator: ZeroActivator) -> None:
        self.app = app
        self.activator = activator
        self.connections = app.connections

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def wrapped_send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "lifespan.startup.complete":
                self.activator.start()
            await send(message)

        async def wrapped_receive() -> MutableMapping[str, Any]:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                await self.activator.stop()
            return message

        await self.app(scope, wrapped_receive, wrapped_send)


def with_zero_activation(app: GatewayApp, models: Sequence[str]) -> GatewayApp | ActivatingApp:
    """`app` itself when no model scales to zero, else the activating wrapper."""
    if not models:
        return app
    return ActivatingApp(app, ZeroActivator(app, models))
