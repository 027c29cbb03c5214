"""`inferplane gateway`: serve the OpenAI-compatible gateway for a fleet file."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

import typer

from inferplane.cli.main import app
from inferplane.errors import InferplaneError

if TYPE_CHECKING:
    from inferplane.gateway.app import GatewayApp
    from inferplane.spec import FleetSpec
    from inferplane.tenancy.service import RateLimitHeaders, Tenancy


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
    access_log_path: Path | None = typer.Option(
        None, "--access-log-path", help="Append the access log to this file, not stderr."
    ),
    db: str | None = typer.Option(
        None, "--db", help="Keys/usage/routes database URL, or @FILE holding it (default: "
        "$INFERPLANE_DATABASE_URL(_FILE), the fleet's, else .inferplane/)."
    ),
    tenancy: bool = typer.Option(True, help="API keys, limits, usage ledger, DB routes."),
    discover: str | None = typer.Option(
        None, "--discover", help="Find each model's replicas at run time: kubernetes "
        "(EndpointSlices of the model's Service; needs inferplane[k8s], docs/deploy.md)."
    ),
    plan: Path | None = typer.Option(
        None, "--plan", help="The fleet's plan (JSON): each replica's cap is the max_num_seqs "
        "its engine was planned with (discovered pods: by their plan instance)."
    ),
    namespace: str | None = typer.Option(
        None, "--namespace", help="Kubernetes namespace to discover in (default: the "
        "pod's own, else the kubeconfig context's, else default)."
    ),
    ratelimit_headers: str | None = typer.Option(
        None,
        "--ratelimit-headers",
        help="x-ratelimit-* on 429s only (on_429) or on every response of a limited key "
        "too (always, like OpenAI); default: the fleet's gateway.ratelimit_headers, else on_429.",
    ),
) -> None:
    """Route OpenAI API traffic to a fleet's engines (chat, completions, embeddings, ...)."""
    from inferplane.gateway.config import GatewayConfig, ModelRoute
    from inferplane.gateway.server import serve

    if ratelimit_headers not in (None, "always", "on_429"):
        raise InferplaneError(
            "unknown rate-limit header mode",
            field="--ratelimit-headers",
            value=ratelimit_headers,
            fix="use always (every response, like OpenAI) or on_429 (refusals only)",
        )
    if discover is not None and fleet is None:
        raise InferplaneError(
            "discovery needs the models to look for",
            field="--discover",
            value=discover,
            fix="give --fleet FLEET.yaml too",
        )
    if namespace is not None and discover != "kubernetes":
        raise InferplaneError(
            "--namespace is for Kubernetes discovery",
            field="--namespace",
            value=namespace,
            fix="add --discover kubernetes, or drop --namespace",
        )
    if plan is not None and fleet is None:
        raise InferplaneError(
            "a plan goes with the fleet file it was made from",
            field="--plan",
            value=str(plan),
            fix="give --fleet FLEET.yaml too",
        )
    if fleet is None and not backend:
        raise InferplaneError(
            "nothing to route",
            field="--fleet",
            fix="give --fleet FLEET.yaml or at least one --backend MODEL=URL",
        )
    spec = None
    the_plan = None
    if fleet is not None:
        from inferplane.gateway.fleet import gateway_config_from_fleet
        from inferplane.spec import load_fleet

        spec = load_fleet(fleet)
        if plan is not None:
            from inferplane.cli.plan_file import check_plan_matches, load_plan

            the_plan = load_plan(plan)
            check_plan_matches(the_plan, spec, plan)
        config = gateway_config_from_fleet(spec, the_plan)
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
    if access_log_path is not None:
        config = replace(config, access_log_path=str(access_log_path))
    source = None
    if discover is not None:
        from inferplane.gateway.discovery.registry import DiscoveryOptions, make_source

        source = make_source(discover, config,
                             DiscoveryOptions(namespace=namespace, plan=the_plan))
    typer.echo(
        f"inferplane gateway on http://{host or config.host}:{port or config.port} "
        f"({len(config.models)} models)",
        err=True,
    )
    zero = sorted(m for m, b in spec.scaling.models.items() if b.min_replicas == 0) if spec else []
    wrap: Callable[[GatewayApp], object] | None = None
    if zero and source is not None:
        # Discovered pods: a model with none is held (KEDA activates on the queue depth)
        # and a pod that turns ready takes the held requests; readiness is the API's, so
        # no /health probing that would re-admit a pod that is draining.
        def wrap(gw: GatewayApp) -> object:
            for model in zero:
                if model in gw.state.pools:
                    gw.state.pools[model].activator = lambda: True
            return gw
    elif zero:  # scaled to zero behind a Service: hold while KEDA activates (docs/scaling.md)
        from inferplane.scaling.activator import with_zero_activation

        def wrap(gw: GatewayApp) -> object:
            return with_zero_activation(gw, zero)

    serve(config, host, port, _tenancy(spec, db, ratelimit_headers) if tenancy else None,
          wrap=wrap, discovery=source)


def _tenancy(spec: FleetSpec | None, db: str | None, ratelimit_headers: str | None) -> Tenancy:
    """Keys, limits, usage ledger and DB routes for the gateway (docs/tenancy.md)."""
    from inferplane.tenancy.wiring import build_tenancy

    mode = cast("RateLimitHeaders | None", ratelimit_headers)
    return build_tenancy(spec, db, ratelimit_headers=mode)
