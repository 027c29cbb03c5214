"""`inferplane lint FLEET.yaml [--json] [--strict]`: advice that is not an error."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from inferplane.cli.main import app
from inferplane.errors import USAGE_EXIT_CODE


@app.command()
def lint(
    fleet: Path = typer.Argument(..., help="Fleet file.", show_default=False),
    as_json: bool = typer.Option(False, "--json", help="One JSON object (docs/diagnose.md)."),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 when there is a warning."),
) -> None:
    """Fleet-level advice: --enforce-eager left on (P33), utilization above the safe band
    (P06), max_model_len at the model's default (P02), TP larger than needed (P16),
    volatile prompt prefixes (P45), timeouts shorter than the longest generation (P40)."""
    from rich.console import Console
    from rich.markup import escape

    from inferplane.doctor.lint import SCHEMA, lint_fleet
    from inferplane.spec import FleetValidationError, load_fleet

    try:
        spec = load_fleet(fleet)
    except FleetValidationError as exc:
        err = Console(stderr=True, highlight=False, soft_wrap=True)
        err.print(f"[bold red]invalid[/] {escape(str(fleet))}: fix these first "
                  "(`inferplane validate`)")
        for problem in exc.problems:
            err.print(f"  {escape(problem.render())}")
        raise typer.Exit(USAGE_EXIT_CODE) from None
    advice = lint_fleet(spec, fleet.resolve().parent)
    warnings = [a for a in advice if a.severity == "warn"]
    if as_json:
        typer.echo(json.dumps({"schema": SCHEMA, "file": str(fleet),
                               "advice": [a.to_json() for a in advice]}, ensure_ascii=False))
    else:
        out = Console(highlight=False, soft_wrap=True)
        if not advice:
            out.print(f"[green]ok[/] {escape(str(fleet))}: no advice")
        for item in advice:
            colour = "yellow" if item.severity == "warn" else "cyan"
            out.print(f"[{colour}]{item.pitfall} {item.severity}[/] {escape(item.where())}: "
                      f"{escape(item.message)}. [bold]Fix:[/] {escape(item.fix)}")
    if strict and warnings:
        raise typer.Exit(1)
