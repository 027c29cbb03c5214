"""Serving the gateway with uvicorn (uvloop + httptools: measured fastest here)."""

from __future__ import annotations

import uvicorn

from inferplane.gateway.app import GatewayApp, build_app
from inferplane.gateway.config import GatewayConfig


def uvicorn_config(app: GatewayApp, host: str, port: int) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,  # the gateway writes its own metadata-only log line
        server_header=False,
        date_header=False,
        log_level="warning",
        backlog=4096,
        proxy_headers=False,  # no X-Forwarded-* rewriting middleware on the hot path
        timeout_keep_alive=75,
    )


def serve(config: GatewayConfig, host: str | None = None, port: int | None = None) -> None:
    """Run the gateway in the foreground until interrupted."""
    app = build_app(config)
    uvicorn.Server(uvicorn_config(app, host or config.host, port or config.port)).run()
