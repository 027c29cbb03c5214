"""`inferplane logs INSTANCE`: an instance's log from the fleet's state directory."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import typer

from inferplane.cli.main import app
from inferplane.errors import InferplaneError
from inferplane.runtime.state import DEFAULT_STATE_DIR


@app.command()
def logs(
    instance: str = typer.Argument(..., help="Instance name (see `inferplane status`)."),
    follow: bool = typer.Option(
        False, "--follow", "-f", help="Keep printing new lines, across log rotation."
    ),
    lines: int = typer.Option(50, "--lines", "-n", help="How many last lines to print first."),
    state_dir: Path = typer.Option(DEFAULT_STATE_DIR, help="The fleet's state directory."),
) -> None:
    """Print an instance's engine log (stdout+stderr); -f follows it like `tail -F`."""
    from inferplane.runtime import logs as logfile
    from inferplane.runtime.control import resolve_state_dir

    if lines < 0:
        raise InferplaneError(
            "--lines cannot be negative",
            field="--lines",
            value=lines,
            fix="use 0 (only new lines with -f) or more",
        )
    state = resolve_state_dir(state_dir)
    path = state.log_dir / f"{instance}.log"
    if "/" in instance or instance.startswith(".") or not path.is_file():
        data = state.read()
        names = sorted(i["name"] for i in (data or {}).get("instances", []))
        raise InferplaneError(
            f"no log for instance {instance!r}",
            field="INSTANCE",
            value=instance,
            fix=f"instances: {', '.join(names)}"
            if names
            else f"no fleet has run from {state.path}; pass its --state-dir",
        )
    out = sys.stdout.buffer

    def write(chunk: bytes) -> None:
        out.write(chunk)
        out.flush()

    if not follow:
        write(logfile.read_tail(path, lines))
        return
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends -f
        logfile.follow(path, write, lines)
