"""`inferplane restart INSTANCE`: restart one engine instance of a running fleet."""

from __future__ import annotations

from pathlib import Path

import typer

from inferplane.cli.main import app
from inferplane.cli.options import state_dir_option
from inferplane.errors import InferplaneError


@app.command()
def restart(
    instance: str = typer.Argument(..., help="Instance name (see `inferplane status`)."),
    state_dir: Path | None = state_dir_option(),
    wait: bool = typer.Option(True, help="Return once the instance is ready again."),
    timeout_s: float = typer.Option(
        600.0, help="With --wait: give up after this long (vLLM startups take minutes)."
    ),
) -> None:
    """Stop routing to INSTANCE, stop its engine and start it again (through the running
    `inferplane up`'s supervisor)."""
    from inferplane.runtime.channel import call
    from inferplane.runtime.registry import find_state_dir

    if timeout_s <= 0:
        raise InferplaneError(
            "--timeout-s must be positive",
            field="--timeout-s",
            value=timeout_s,
            fix="e.g. --timeout-s 600",
        )
    state = find_state_dir(state_dir)
    request = {"op": "restart", "instance": instance, "wait_s": timeout_s if wait else None}
    reply = call(state, request, (timeout_s if wait else 0) + 15)
    if not reply.get("ok"):
        known = reply.get("instances")
        raise InferplaneError(
            str(reply.get("error", "the restart was refused")),
            field="INSTANCE",
            value=instance,
            fix=f"instances: {', '.join(known)}"
            if known
            else f"see `inferplane status` and `inferplane logs {instance}`",
        )
    rec = reply["instance"]
    if wait:
        typer.echo(
            f"{instance} restarted: {rec['state']} (pid {rec['pid']}, restarts {rec['restarts']})"
        )
    else:
        typer.echo(f"{instance}: restart requested")
