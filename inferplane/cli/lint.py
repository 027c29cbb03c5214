"""`inferplane lint FLEET.yaml [--json] [--strict]`: advice that is not an error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from inferplane.cli.main import app
from inferplane.errors import USAGE_EXIT_CODE


@app.command()
def lint(
    fleet: Path = typer.Argument(
        ..., help="Fleet file, or Kubernetes manifests (a file or a directory).",
        show_default=False),
    as_json: bool = typer.Option(False, "--json", help="One JSON object (docs/diagnose.md)."),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 when there is a warning."),
    models_root: Path | None = typer.Option(
        None, "--models-root", help="Manifests: where the models they name are (ORG--NAME "
        "or NAME directories with config.json); else a path or the Hugging Face cache."),
    disk_read_mib_s: float = typer.Option(
        200.0, "--disk-read-mib-s", help="Manifests: read speed of the model store, for "
        "the load-time estimate (as `render`)."),
) -> None:
    """Fleet-level advice: --enforce-eager left on (P33), utilization above the safe band
    (P06), max_model_len at the model's default (P02), TP larger than needed (P16),
    volatile prompt prefixes (P45), timeouts shorter than the longest generation (P40).
    Given Kubernetes manifests that run `vllm serve` (or a vllm/vllm-openai image with
    `args:`): probes shorter than the model's load-time estimate (P24) and utilization above
    the safe band (P06)."""
    from rich.console import Console
    from rich.markup import escape

    from inferplane.doctor.lint import SCHEMA, lint_fleet
    from inferplane.doctor.probes import is_manifest_path
    from inferplane.spec import FleetValidationError, load_fleet

    if not fleet.exists():
        Console(stderr=True, highlight=False, soft_wrap=True).print(
            f"[bold red]error[/] {escape(str(fleet))}: no such file or directory. Fix: give "
            "a fleet file or Kubernetes manifests")
        raise typer.Exit(USAGE_EXIT_CODE)
    if is_manifest_path(fleet):
        advice = _manifest_advice(fleet, models_root, disk_read_mib_s)
    else:
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


def _manifest_advice(path: Path, models_root: Path | None, disk_read_mib_s: float) -> list[Any]:
    from dataclasses import replace

    from rich.console import Console
    from rich.markup import escape

    from inferplane.deploy.options import RenderOptions
    from inferplane.doctor.probes import lint_manifests
    from inferplane.errors import InferplaneError

    try:
        options = replace(RenderOptions(), disk_read_mib_s=disk_read_mib_s)
        return lint_manifests(path, models_root=models_root, options=options)
    except InferplaneError as exc:
        # the same form as the other refusals: `error PATH: what. Fix: how`
        if exc.field in ("manifests", "manifest"):  # a file: name it as the others do
            where, got = str(exc.value if exc.value is not None else path), ""
        else:
            where = exc.field or str(path)
            got = f" (got {exc.value!r})" if exc.value is not None else ""
        fix = f". Fix: {exc.fix}" if exc.fix else ""
        Console(stderr=True, highlight=False, soft_wrap=True).print(
            f"[bold red]error[/] {escape(where)}: {escape(exc.message)}{escape(got)}"
            f"{escape(fix)}")
        raise typer.Exit(USAGE_EXIT_CODE) from None
