"""`inferplane gateway`: serve the OpenAI-compatible gateway for a fleet file."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from inferplane.cli.main import app
from inferplane.errors import InferplaneError

if TYPE_CHECKING:
    from inferplane.spec import FleetSpec
    from inferplane.tenancy.service import Tenancy


def _parse_backend(text: str) -> tuple[str, str]:
    model, sep, url = text.partition("=")
    if not sep or not model or not url.startswith(("http://", "https://")):
        raise InferplaneError(
            "a backend is MODEL=URL",
            field="--backend",
            value=text,
            fix="e.g. --backend llama=http://127.0.0.1:8001 (base URL without /v1)",
        )
    return model, url


@app.command()
def gateway(
    fleet: Path | None = typer.Option(None, "--fleet", help="Fleet file (models, routes)."),
    host: str | None = typer.Option(None, help="Listen address (default: the fleet's)."),
    port: int | None = typer.Option(None, help="Listen port (default: the fleet's)."),
    backend: list[str] = typer.Option(
        [], "--backend", help="MODEL=URL of an engine started elsewhere; repeatable."
    ),
    access_log: bool = typer.Option(True, help="One JSON line per request on stderr."),
    db: str | None = typer.Option(
        None, "--db", help="Keys/usage/routes database (default: fleet's, else .inferplane/)."
    ),
    tenancy: bool = typer.Option(True, help="API keys, limits, usage ledger, DB routes."),
) -> None:
    """Route OpenAI API traffic to a fleet's engines (chat, completions, embeddings, ...)."""
    from inferplane.gateway.config import GatewayConfig, ModelRoute
    from inferplane.gateway.server import serve

    if fleet is None and not backend:
        raise InferplaneError(
            "nothing to route",
            field="--fleet",
            fix="give --fleet FLEET.yaml or at least one --backend MODEL=URL",
        )
    spec = None
    if fleet is not None:
        from inferplane.gateway.fleet import gateway_config_from_fleet
        from inferplane.spec import load_fleet

        spec = load_fleet(fleet)
        config = gateway_config_from_fleet(spec)
    else:
        config = GatewayConfig()
    extra: dict[str, list[str]] = {}
    for text in backend:
        model, url = _parse_backend(text)
        extra.setdefault(model, []).append(url)
    models = []
    for route in config.models:
        urls = extra.pop(route.name, [])
        models.append(replace(route, endpoints=(*route.endpoints, *urls)) if urls else route)
    models.extend(ModelRoute(name, endpoints=tuple(urls)) for name, urls in extra.items())
    config = replace(config, models=tuple(models), access_log=access_log)
    typer.echo(
        f"inferplane gateway on http://{host or config.host}:{port or config.port} "
        f"({len(config.models)} models)",
        err=True,
    )
    serve(config, host, port, _tenancy(spec, db) if tenancy else None)


def _tenancy(spec: FleetSpec | None, db: str | None) -> Tenancy:
    """Keys, limits, usage ledger and DB routes for the gateway (docs/tenancy.md)."""
    import os

    from inferplane.store import Store, database_url
    from inferplane.tenancy.limits import Limits, MemoryLimiter, RedisLimiter
    from inferplane.tenancy.service import Tenancy

    gw = spec.gateway if spec is not None else None
    per_key = spec.limits.per_key if spec is not None else None
    redis_url = os.environ.get("INFERPLANE_REDIS_URL") or (gw.redis_url if gw else None)
    return Tenancy(
        Store(database_url(db, gw.database_url if gw else None)),
        RedisLimiter(redis_url) if redis_url else MemoryLimiter(),
        auth=gw.auth if gw else "auto",
        default_limits=Limits(per_key.rpm, per_key.tpm, per_key.max_concurrent)
        if per_key is not None
        else None,
        admin_token=os.environ.get(gw.admin_token_env if gw else "INFERPLANE_ADMIN_TOKEN"),
        seed=[
            (r.model, tuple((b.target, float(b.weight)) for b in r.backends))
            for r in (spec.routes if spec is not None else [])
        ],
        announce=True,
    )
