"""`inferplane events`: the autoscaler's decisions with their reasons (docs/scaling.md)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from inferplane.cli.main import app
from inferplane.cli.options import state_dir_option


@app.command()
def events(
    state_dir: Path | None = state_dir_option(),
    model: str | None = typer.Option(None, help="Only this model's events."),
    last: int = typer.Option(50, min=1, help="How many of the latest events to show."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (stable schema)."),
) -> None:
    """Show the scaling events (scale up/down, sleep, wake, refusals) of a fleet."""
    import time

    from rich.console import Console
    from rich.table import Table

    from inferplane.runtime.registry import find_state_dir
    from inferplane.scaling.events import read_events

    state = find_state_dir(state_dir)
    found = read_events(state.path, model)[-last:]
    if as_json:
        typer.echo(json.dumps({"events": found}, indent=2))
        return
    console = Console()
    if not found:
        console.print(f"no scaling events in {state.path} (is `scaling:` set in the fleet?)")
        return
    table = Table(box=None)
    for col in ("time", "model", "event", "replicas", "instance", "reason"):
        table.add_column(col, overflow="fold")
    for e in found:
        table.add_row(
            time.strftime("%H:%M:%S", time.localtime(e.get("at", 0))), str(e.get("model")),
            str(e.get("kind")), f"{e.get('replicas_before')} -> {e.get('replicas_after')}",
            str(e.get("instance") or "-"), str(e.get("reason")),
        )
    console.print(table)
