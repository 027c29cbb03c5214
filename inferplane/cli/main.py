"""Typer application. Commands live in sibling modules and register themselves here."""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from inferplane import __version__
from inferplane.errors import USAGE_EXIT_CODE, InferplaneError

app = typer.Typer(
    name="inferplane",
    help="Plan, run, route and deploy fleets of LLMs served with vLLM.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

err_console = Console(stderr=True)


@app.command()
def version() -> None:
    """Print the inferplane version."""
    typer.echo(__version__)


def _register_commands() -> None:
    # Imported here so each command module can import `app` without a cycle.
    from inferplane.cli import estimate  # noqa: F401


def main() -> None:
    """Entry point: run the app, turning user errors into a message and exit code 2."""
    _register_commands()
    try:
        app(standalone_mode=False)
    except InferplaneError as exc:
        err_console.print(f"[bold red]error:[/] {exc.render()}", highlight=False)
        sys.exit(USAGE_EXIT_CODE)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except Exception as exc:  # click usage errors arrive here in non-standalone mode
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(USAGE_EXIT_CODE)
        raise
