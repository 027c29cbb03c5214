"""`inferplane usage`: tokens and requests from the usage ledger."""

from __future__ import annotations

import csv
import json
import sys
import time
from pathlib import Path

import typer
from rich.console import Console

from inferplane.cli.keys import DB_HELP, resolve_db, with_store
from inferplane.cli.main import app
from inferplane.cli.options import state_dir_option
from inferplane.cli.tables import Col, fitted_table
from inferplane.errors import InferplaneError


def parse_since(text: str | None, now: float) -> float | None:
    """'24h', '7d', '30m', a Unix time or an ISO date (UTC)."""
    if not text:
        return None
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        if text[-1] in units and text[:-1].replace(".", "", 1).isdigit():
            return now - float(text[:-1]) * units[text[-1]]
        if text.replace(".", "", 1).isdigit():
            return float(text)
        import calendar

        return float(calendar.timegm(time.strptime(text[:10], "%Y-%m-%d")))
    except ValueError:
        raise InferplaneError(
            "cannot read --since", field="--since", value=text,
            fix="use e.g. 24h, 7d, 2026-11-01 or a Unix time",
        ) from None  # fmt: skip


@app.command()
def usage(
    by: str = typer.Option("key", "--by", help="Group by key, model or day (UTC)."),
    since: str | None = typer.Option(None, help="Only since: 24h, 7d, 2026-11-01, Unix time."),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    fleet: Path | None = typer.Option(None, "--fleet", help="Read gateway.database_url."),
    state_dir: Path | None = state_dir_option(),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    as_csv: bool = typer.Option(False, "--csv", help="Print CSV."),
) -> None:
    """Requests and tokens per key, model or day from the usage ledger."""
    from inferplane.tenancy.ledger import usage_report

    start = parse_since(since, time.time())
    rows = with_store(resolve_db(db, fleet, state_dir), lambda s: usage_report(s, by, start))
    if as_json:
        typer.echo(json.dumps({"by": by, "since": start, "rows": rows}, indent=2))
        return
    columns = [by, *(["name"] if by == "key" else []), "requests", "errors", "prompt_tokens",
               "completion_tokens", "total_tokens"]  # fmt: skip
    if as_csv:
        writer = csv.DictWriter(sys.stdout, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return
    short = {"prompt_tokens": "prompt", "completion_tokens": "completion",
             "total_tokens": "total"}  # fmt: skip
    cols = [Col(c, short.get(c), justify="left" if i < 2 and c in (by, "name") else "right")
            for i, c in enumerate(columns)]  # fmt: skip
    console = Console()
    console.print(fitted_table(cols, [[str(r[c]) for c in columns] for r in rows], console.width))
