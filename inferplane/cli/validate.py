"""`inferplane validate FLEET.yaml [FLEET.yaml ...] [--json]`: check fleet files."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape

from inferplane.cli.main import app
from inferplane.errors import USAGE_EXIT_CODE

if TYPE_CHECKING:
    from inferplane.spec import FleetSummary, Problem


@dataclass(frozen=True)
class _Result:
    file: str
    summary: FleetSummary | None
    problems: tuple[Problem, ...]

    @property
    def valid(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        # Stable schema: {file, valid, errors: [{line, column, field, value, message, fix}],
        # summary: {...} or null when invalid}.
        return {
            "file": self.file,
            "valid": self.valid,
            "errors": [problem.to_json() for problem in self.problems],
            "summary": self.summary.to_json() if self.summary else None,
        }


@app.command()
def validate(
    fleets: list[Path] = typer.Argument(..., help="Fleet files to check.", show_default=False),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per file, one per line."),
) -> None:
    """Check fleet files: every problem with file:line, field, value and fix. Exit 2 if any."""
    results = [_check(path) for path in fleets]
    if as_json:
        for result in results:
            typer.echo(json.dumps(result.to_json(), ensure_ascii=False))
    else:
        _print(results)
    if not all(result.valid for result in results):
        raise typer.Exit(USAGE_EXIT_CODE)


def _check(path: Path) -> _Result:
    from inferplane.spec import FleetValidationError, load_fleet, summarize

    try:
        fleet = load_fleet(path)
    except FleetValidationError as exc:
        return _Result(str(path), None, exc.problems)
    return _Result(str(path), summarize(fleet), ())


def _print(results: list[_Result]) -> None:
    out = Console(highlight=False, soft_wrap=True)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    for result in results:
        file = escape(result.file)
        if result.summary is not None:
            out.print(f"[green]ok[/] {file}: {escape(result.summary.describe())}")
            continue
        count = len(result.problems)
        err.print(f"[bold red]invalid[/] {file}: {count} problem{'s' * (count != 1)}")
        for problem in result.problems:
            err.print(f"  {escape(problem.render())}")
