"""`inferplane status`: instances, their state and ports, and the gateway URL."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from inferplane.cli.main import app
from inferplane.errors import InferplaneError
from inferplane.runtime.state import DEFAULT_STATE_DIR


@app.command()
def status(
    state_dir: Path = typer.Option(DEFAULT_STATE_DIR, help="The fleet's state directory."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (stable schema)."),
) -> None:
    """Show the fleet running from STATE_DIR (works from any shell)."""
    from inferplane.cli.up import print_status
    from inferplane.runtime.control import resolve_state_dir

    state = resolve_state_dir(state_dir)
    data = state.read()
    if data is None:
        raise InferplaneError(
            "no fleet state here", field="--state-dir", value=str(state.path),
            fix="start a fleet with `inferplane up FLEET.yaml`, or pass its --state-dir",
        )
    if state.running_pid() is None and data.get("phase") != "stopped":
        data["phase"] = "stopped"  # the owner died without writing its final state
        for inst in data.get("instances", []):
            inst["state"] = "stopped"
    if as_json:
        typer.echo(json.dumps(data, indent=2))
    else:
        print_status(data)
