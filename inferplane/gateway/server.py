"""Serving the gateway with uvicorn (uvloop + httptools: measured fastest here)."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import uvicorn

from inferplane.gateway import logfilter
from inferplane.gateway.app import GatewayApp, build_app
from inferplane.gateway.config import GatewayConfig
from inferplane.gateway.connections import Connections, protocol_for, raise_nofile_soft_limit

if TYPE_CHECKING:
    from inferplane.gateway.discovery import DiscoverySource
    from inferplane.tenancy.service import Tenancy


def uvicorn_config(
    app: Any,
    host: str,
    port: int,
    connections: Connections | None = None,
    **overrides: Any,
) -> uvicorn.Config:
    """uvicorn for the gateway (`app`, or an ASGI wrapper of it with its `connections`):
    httptools bounded by the gateway's connection limits (`connections.py`)."""
    if connections is None:
        assert isinstance(app, GatewayApp), "pass the gateway's connections with a wrapper"
        connections = app.connections
    settings: dict[str, Any] = dict(
        host=host,
        port=port,
        loop="uvloop",
        http=protocol_for(connections),
        lifespan="on",
        access_log=False,  # the gateway writes its own metadata-only log line
        server_header=False,
        date_header=False,
        log_level="warning",
        backlog=4096,
        proxy_headers=False,  # no X-Forwarded-* rewriting middleware on the hot path
        timeout_keep_alive=connections.limits.keepalive_timeout_s,
    )
    settings.update(overrides)
    return uvicorn.Config(app, **settings)


def serve(
    config: GatewayConfig,
    host: str | None = None,
    port: int | None = None,
    tenancy: Tenancy | None = None,
    wrap: Callable[[GatewayApp], Any] | None = None,
    discovery: DiscoverySource | None = None,
) -> None:
    """Run the gateway in the foreground until interrupted. `wrap` may put an ASGI
    wrapper around the app (scale-from-zero activation, `inferplane.scaling.activator`);
    `discovery` adds the replicas a source finds (`inferplane.gateway.discovery`)."""
    raise_nofile_soft_limit()  # P30; the connection cap stays below what is left
    logfilter.install()  # one line per 10 s, not a traceback per failed accept()
    tune_gc()
    app = build_app(config, tenancy)
    app.discovery = discovery
    asgi = wrap(app) if wrap is not None else app
    uvicorn.Server(
        uvicorn_config(asgi, host or config.host, port or config.port, app.connections)
    ).run()


def tune_gc() -> None:
    """Fewer, cheaper garbage collections: every request allocates a few dozen objects
    and the default gen-0 threshold (700) ran a collection every few requests, each one
    walking all live connections (measured: ~10% of CPU at 256 connections)."""
    if os.environ.get("INFERPLANE_GATEWAY_GC_DEFAULT"):
        return
    gc.collect()
    gc.freeze()  # startup objects (modules, config) are never garbage
    gc.set_threshold(20_000, 20, 20)
