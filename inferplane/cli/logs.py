"""`inferplane logs INSTANCE`: an instance's log from the fleet's state directory."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import typer

from inferplane.cli.main import app
from inferplane.cli.options import state_dir_option
from inferplane.errors import InferplaneError


@app.command()
def logs(
    instance: str = typer.Argument(
        ..., help="Instance name (see `inferplane status`), `gateway` (the gateway's log), "
        "`gateway-access` (one JSON line per request) or `up` (the detached fleet's output).",
    ),
    follow: bool = typer.Option(
        False, "--follow", "-f", help="Keep printing new lines, across log rotation."
    ),
    lines: int = typer.Option(50, "--lines", "-n", help="How many last lines to print first."),
    state_dir: Path | None = state_dir_option(),
) -> None:
    """Print an instance's engine log (stdout+stderr), or the gateway's; -f follows it like
    `tail -F`."""
    from inferplane.runtime import logs as logfile
    from inferplane.runtime.registry import find_state_dir

    if lines < 0:
        raise InferplaneError(
            "--lines cannot be negative",
            field="--lines",
            value=lines,
            fix="use 0 (only new lines with -f) or more",
        )
    state = find_state_dir(state_dir)
    path = state.up_log if instance == "up" else state.log_dir / f"{instance}.log"
    if "/" in instance or instance.startswith(".") or not path.is_file():
        data = state.read()
        names = sorted(i["name"] for i in (data or {}).get("instances", []))
        names += [n for n in ("gateway", "gateway-access")
                  if (state.log_dir / f"{n}.log").is_file()]  # fmt: skip
        names += ["up"] if state.up_log.is_file() else []
        import difflib

        near = difflib.get_close_matches(instance, names, n=1, cutoff=0.6)
        if near:  # a typo: the one name meant, not the whole list
            raise InferplaneError(f"no log for instance {instance!r}; did you mean {near[0]}?",
                                  field="INSTANCE", value=instance,
                                  fix=f"inferplane logs {near[0]}")
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
