"""Typer application. Commands live in sibling modules and register themselves here."""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.markup import escape

from inferplane import __version__
from inferplane.errors import USAGE_EXIT_CODE, InferplaneError

app = typer.Typer(
    name="inferplane",
    help="Plan, run, route and deploy fleets of LLMs served with vLLM.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# soft_wrap: one error is one line, also in logs (a detached `up` reads its child's back).
err_console = Console(stderr=True, soft_wrap=True)


@app.callback()
def _root() -> None:
    """Plan, run, route and deploy fleets of LLMs served with vLLM."""


@app.command()
def version() -> None:
    """Print the inferplane version."""
    typer.echo(__version__)


# Each module registers its commands on `app` when imported (one command per module).
COMMAND_MODULES: tuple[str, ...] = (
    "estimate", "gpus", "validate", "sim", "gateway", "up", "down", "status", "plan", "render",
    "apply", "keys", "usage", "routes", "logs", "restart", "events", "diagnose", "lint", "doctor",
    "bench", "capacity", "monitoring", "trace",
)


def _register_commands() -> None:
    # Imported here so each command module can import `app` without a cycle.
    import importlib

    for module in COMMAND_MODULES:
        importlib.import_module(f"inferplane.cli.{module}")
    from inferplane.cli.help_text import polish

    polish(app)


def main() -> None:
    """Entry point: run the app, turning user errors into a message and exit code 2."""
    _register_commands()
    try:
        app()  # standalone: click prints usage errors itself and exits 2
    except InferplaneError as exc:
        # escaped: a fix such as pip install 'inferplane[tracing]' or an [::1] address is
        # text, not Rich markup (unescaped, "[tracing]" vanished from the message)
        err_console.print(f"[bold red]error:[/] {escape(exc.render())}", highlight=False)
        sys.exit(USAGE_EXIT_CODE)
