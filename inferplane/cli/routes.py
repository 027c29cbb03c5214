"""`inferplane routes set|show`: weighted routes in the store, hot-reloaded by gateways."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from inferplane.cli.keys import DB_HELP, resolve_db, with_store
from inferplane.cli.main import app
from inferplane.cli.options import state_dir_option
from inferplane.errors import InferplaneError

routes_app = typer.Typer(help="Weighted routes (canaries) and per-key overrides.",
                         no_args_is_help=True)  # fmt: skip
app.add_typer(routes_app, name="routes")


def parse_targets(items: list[str]) -> list[tuple[str, float]]:
    out = []
    for item in items:
        model, sep, weight = item.partition("=")
        try:
            value = float(weight)
        except ValueError:
            value = -1.0
        if not sep or not model or value < 0:
            raise InferplaneError(
                "a target is MODEL=WEIGHT", field="targets", value=item,
                fix="e.g. llama-v1=95 llama-v2=5",
            )  # fmt: skip
        out.append((model, value))
    return out


@routes_app.command("set")
def set_(
    route: str = typer.Argument(..., help="The client-facing model name."),
    targets: list[str] = typer.Argument(None, help="MODEL=WEIGHT ...; none deletes the route."),
    key: str | None = typer.Option(None, "--key", help="Override for this key id only."),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    fleet: Path | None = typer.Option(None, "--fleet", help="Read gateway.database_url."),
    state_dir: Path | None = state_dir_option(),
) -> None:
    """Set a route's weights, e.g. `routes set llama llama-v1=95 llama-v2=5` (a 5% canary).
    Running gateways apply it within their refresh interval (2 s)."""
    from inferplane.tenancy.routes import set_route

    parsed = parse_targets(targets or [])
    with_store(resolve_db(db, fleet, state_dir), lambda s: set_route(s, route, parsed, key))
    total = sum(w for _, w in parsed)
    shares = ", ".join(f"{m} {100 * w / total:.1f}%" for m, w in parsed) or "deleted"
    typer.echo(f"{route}{f' (key {key})' if key else ''}: {shares}")


@routes_app.command("show")
def show(
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    fleet: Path | None = typer.Option(None, "--fleet", help="Read gateway.database_url."),
    state_dir: Path | None = state_dir_option(),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show weighted routes and per-key overrides."""
    from inferplane.tenancy.routes import load_routes

    table = with_store(resolve_db(db, fleet, state_dir), load_routes)
    rows = [
        {"route": name, "key_id": key_id, "target": t, "weight": w}
        for key_id, routes in [(None, table.weighted), *table.per_key.items()]
        for name, targets in routes.items()
        for t, w in targets
    ]
    if as_json:
        typer.echo(json.dumps({"routes": rows}, indent=2))
        return
    out = Table("route", "key", "target", "weight", "share")
    for name, key_id, targets in [
        (n, k, ts) for k, routes in [(None, table.weighted), *table.per_key.items()]
        for n, ts in routes.items()
    ]:  # fmt: skip
        total = sum(w for _, w in targets)
        for t, w in targets:
            out.add_row(name, key_id or "*", t, f"{w:g}", f"{100 * w / total:.1f}%")
    Console().print(out)
