"""`inferplane down`: drain and stop a fleet started with `inferplane up --detach`."""

from __future__ import annotations

from pathlib import Path

import typer

from inferplane.cli.main import app
from inferplane.cli.options import state_dir_option


@app.command()
def down(
    state_dir: Path | None = state_dir_option(),
    timeout_s: float = typer.Option(
        900.0, help="Give up waiting after this long (the fleet's grace period is 300 s)."
    ),
    force: bool = typer.Option(False, "--force", help="Do not wait for in-flight requests."),
) -> None:
    """Stop admitting requests, let in-flight ones finish, then stop every engine. Exits 0
    with "already stopped" when no fleet runs there."""
    from rich.console import Console

    from inferplane.cli.progress import FleetProgress
    from inferplane.runtime import control
    from inferplane.runtime.registry import find_state_dir

    state = find_state_dir(state_dir)
    if state.running_pid() is None:  # as `docker compose down`: nothing to do is success
        typer.echo(f"already stopped: no fleet is running from {state.path}")
        return
    hint = "`inferplane down --force` cuts it short"
    progress = FleetProgress(Console(highlight=False), force_hint=hint)
    try:
        stopped = control.stop_fleet(state, timeout_s, force, progress.update)
    finally:
        progress.close()
    if not stopped.exited:  # its state is released, but the process is not gone (yet)
        typer.echo(f"fleet released its state, but pid {stopped.pid} had not exited after "
                   f"{timeout_s:g} s", err=True)
        raise typer.Exit(1)
    typer.echo(f"fleet stopped (pid {stopped.pid})")
