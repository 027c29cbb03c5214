"""Serving the gateway: its own HTTP/1.1 protocol (`h1.py`, the default) or uvicorn's
httptools protocol (`gateway.server: uvicorn`), both on uvloop and both bounded by the
gateway's connection limits (`connections.py`)."""

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
from inferplane.gateway.h1server import NativeServer

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


def gateway_server(
    app: Any,
    host: str,
    port: int,
    connections: Connections | None = None,
    kind: str | None = None,
    **overrides: Any,
) -> uvicorn.Server | NativeServer:
    """The server for the gateway (`app`, or an ASGI wrapper of it with its `connections`):
    `kind` ("native" or "uvicorn"; default: the gateway's `config.server`). `overrides`
    are uvicorn settings; the native server takes `backlog`, `timeout_graceful_shutdown`
    and `after_startup` (called once the app's startup is done) of them and runs on the
    loop it is started on (uvloop from `run()`)."""
    if connections is None or kind is None:
        gateway = app if isinstance(app, GatewayApp) else getattr(app, "gateway", None)
        if connections is None:
            assert isinstance(gateway, GatewayApp), "pass the connections with a wrapper"
            connections = gateway.connections
        if kind is None:
            kind = gateway.config.server if isinstance(gateway, GatewayApp) else "native"
    if kind == "uvicorn":
        return uvicorn.Server(uvicorn_config(app, host, port, connections, **overrides))
    unknown = set(overrides) - {"backlog", "timeout_graceful_shutdown", "loop",
                                "after_startup"}  # fmt: skip
    if unknown:
        raise TypeError(f"the native gateway server has no settings {sorted(unknown)}")
    return NativeServer(
        app, host, port, connections,
        backlog=overrides.get("backlog", 4096),
        timeout_graceful_shutdown=overrides.get("timeout_graceful_shutdown"),
        after_startup=overrides.get("after_startup"),
    )  # fmt: skip


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
    extra = {"after_startup": freeze_heap} if config.server == "native" else {}
    gateway_server(
        asgi, host or config.host, port or config.port, app.connections, config.server, **extra
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


def freeze_heap() -> None:
    """After the app's startup: what it built (the app, the tenancy store and its
    SQLAlchemy engine, the upstream pool) lives as long as the process, so a full
    collection need not walk it. Unfrozen, each full collection under load took 60-80 ms
    with the loop stopped (measured with `gc.callbacks`, tenancy on)."""
    if os.environ.get("INFERPLANE_GATEWAY_GC_DEFAULT"):
        return
    gc.collect()
    gc.freeze()
