"""`inferplane keys create|list|revoke|rotate`: API keys in the store (secrets shown once)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from rich.console import Console

from inferplane.cli.main import app
from inferplane.cli.options import state_dir_option
from inferplane.cli.tables import Col, fitted_table

if TYPE_CHECKING:  # SQLAlchemy and Alembic load on use: `inferplane --help` stays fast
    from inferplane.store import Store

T = TypeVar("T")
keys_app = typer.Typer(help="Create, list, revoke and rotate API keys.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")

KEY_COLUMNS = (
    Col("id"), Col("name"), Col("prefix", drop=6), Col("models", drop=2, wrap=True),
    Col("rpm", drop=5), Col("tpm", drop=4), Col("concurrent", "conc", drop=7),
    Col("budget", drop=3), Col("priority", "prio", drop=8), Col("expires", drop=9),
    Col("revoked", drop=1),
)  # fmt: skip
DB_HELP = (
    "Database URL, or @FILE holding it (keeps a password out of `ps`; default: "
    "$INFERPLANE_DATABASE_URL(_FILE), the fleet's gateway.database_url, the running fleet's "
    "database, else sqlite:///.inferplane/inferplane.db)."
)


def resolve_db(db: str | None, fleet: Path | None, state_dir: Path | None = None) -> str:
    """--db (`@FILE`: read from FILE), $INFERPLANE_DATABASE_URL(_FILE), the fleet file's
    gateway.database_url, then the database of the running fleet (found like `inferplane
    status` finds it), else the default SQLite file in ./.inferplane."""
    import os

    from inferplane.store import database_url
    from inferplane.store.db import DATABASE_URL_ENV
    from inferplane.tenancy.wiring import DATABASE_URL_FILE_ENV, read_secret_file

    if db is not None and db.startswith("@"):  # the URL in a file: no password in `ps`
        db = read_secret_file(db[1:], "--db")
    elif db is None and os.environ.get(DATABASE_URL_FILE_ENV):
        db = read_secret_file(os.environ[DATABASE_URL_FILE_ENV], DATABASE_URL_FILE_ENV)
    if db or os.environ.get(DATABASE_URL_ENV):
        return database_url(db)
    if fleet is not None:
        from inferplane.spec import load_fleet

        fleet_url = load_fleet(fleet).gateway.database_url
        if fleet_url:
            return database_url(None, fleet_url)
    from inferplane.runtime.registry import find_state_dir

    state = find_state_dir(state_dir)
    try:  # written by `up` (mode 0600): also a --db given to it
        recorded = (state.path / "database_url").read_text().strip()
    except OSError:
        recorded = ""
    if recorded:
        return database_url(recorded)
    if (state.path / "inferplane.db").is_file():
        return database_url(f"sqlite:///{state.path / 'inferplane.db'}")
    return database_url()


def with_store(url: str, work: Callable[[Store], Awaitable[T]]) -> T:
    from inferplane.store import Store

    async def run() -> T:
        store = await Store.open(url)
        try:
            return await work(store)
        finally:
            await store.close()

    return asyncio.run(run())


def _when(ts: float | None) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts)) if ts else "-"


def _print_key(row: dict[str, Any], secret: str | None, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps({**row, **({"key": secret} if secret else {})}, indent=2))
        return
    typer.echo(f"{row['id']}  {row['name']}")
    if secret:
        typer.echo(f"key: {secret}")
        typer.echo("Store it now: it is shown only once (only its hash is kept).", err=True)


@keys_app.command("create")
def create(
    name: str = typer.Argument(..., help="A name for the key, e.g. the team or app."),
    team: str | None = typer.Option(None, help="Team or project that owns the key."),
    models: str | None = typer.Option(None, help="Comma-separated models it may use."),
    rpm: int | None = typer.Option(None, help="Requests per minute."),
    tpm: int | None = typer.Option(None, help="Tokens (prompt + completion) per minute."),
    max_concurrent: int | None = typer.Option(None, help="Requests in flight at once."),
    budget_tokens: int | None = typer.Option(None, help="Token budget per period."),
    budget_period: str = typer.Option("month", help="day, month or total."),
    priority: str = typer.Option("interactive", help="interactive or batch."),
    expires_days: float | None = typer.Option(None, help="Expire after this many days."),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    fleet: Path | None = typer.Option(None, "--fleet", help="Read gateway.database_url."),
    state_dir: Path | None = state_dir_option(),
    as_json: bool = typer.Option(False, "--json", help="Print JSON; the secret is `key`."),
    enable_auth: bool = typer.Option(
        False, "--enable-auth",
        help="Needed for the first key of a running fleet with gateway.auth: auto: it turns "
        "auth on there.",
    ),
) -> None:
    """Create a key. The secret is printed once; only its hash is stored. The first key
    of a running `gateway.auth: auto` fleet turns its auth on: that needs --enable-auth."""
    from inferplane.cli import keys_live
    from inferplane.tenancy.keys import create_key, key_count

    model_list = [m.strip() for m in models.split(",") if m.strip()] if models else None
    url = resolve_db(db, fleet, state_dir)
    live = keys_live.live_fleet(url, state_dir)

    async def work(s: Store) -> tuple[Any, str, bool]:
        first = keys_live.first_key_turns_auth_on(live, await key_count(s))
        if first and not enable_auth:
            assert live is not None
            raise keys_live.refuse(live)
        row, secret = await create_key(
            s, name, team=team, models=model_list, rpm=rpm, tpm=tpm,
            max_concurrent=max_concurrent, budget_tokens=budget_tokens,
            budget_period=budget_period, priority=priority,
            expires_in_s=expires_days * 86400 if expires_days is not None else None,
        )  # fmt: skip
        return row, secret, first

    row, secret, turned_on = with_store(url, work)
    _print_key(row.as_dict(), secret, as_json)
    if turned_on and live is not None:
        for line in keys_live.announce(live):
            typer.echo(line, err=True)


@keys_app.command("list")
def list_(
    all_: bool = typer.Option(False, "--all", help="Include revoked keys."),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    fleet: Path | None = typer.Option(None, "--fleet", help="Read gateway.database_url."),
    state_dir: Path | None = state_dir_option(),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List keys (never their secrets)."""
    from inferplane.tenancy.keys import list_keys

    url = resolve_db(db, fleet, state_dir)
    rows = [r.as_dict() for r in with_store(url, lambda s: list_keys(s, all_))]
    if as_json:
        typer.echo(json.dumps({"keys": rows}, indent=2))
        return
    table_rows = []
    for r in rows:
        budget = f"{r['budget_tokens']}/{r['budget_period']}" if r["budget_tokens"] else "-"
        table_rows.append([
            r["id"], r["name"], r["prefix"] + "…", ",".join(r["allowed_models"] or ["*"]),
            str(r["rpm"] or "-"), str(r["tpm"] or "-"), str(r["max_concurrent"] or "-"),
            budget, r["priority"], _when(r["expires_at"]), _when(r["revoked_at"]),
        ])  # fmt: skip
    console = Console()
    console.print(fitted_table(KEY_COLUMNS, table_rows, console.width))


@keys_app.command("revoke")
def revoke(
    key_id: str = typer.Argument(..., help="The key's id (key_...)."),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    fleet: Path | None = typer.Option(None, "--fleet", help="Read gateway.database_url."),
    state_dir: Path | None = state_dir_option(),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Revoke a key; gateways refuse it within their refresh interval (2 s)."""
    from inferplane.tenancy.keys import revoke_key

    row = with_store(resolve_db(db, fleet, state_dir), lambda s: revoke_key(s, key_id))
    _print_key(row.as_dict(), None, as_json)


@keys_app.command("rotate")
def rotate(
    key_id: str = typer.Argument(..., help="The key's id (key_...)."),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    fleet: Path | None = typer.Option(None, "--fleet", help="Read gateway.database_url."),
    state_dir: Path | None = state_dir_option(),
    as_json: bool = typer.Option(False, "--json", help="Print JSON; the secret is `key`."),
) -> None:
    """Give a key a new secret (same id, limits and usage); the old secret stops working."""
    from inferplane.tenancy.keys import rotate_key

    row, secret = with_store(resolve_db(db, fleet, state_dir), lambda s: rotate_key(s, key_id))
    _print_key(row.as_dict(), secret, as_json)
