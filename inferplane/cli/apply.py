"""`inferplane apply DIR`: server-side apply a rendered Kubernetes directory (dry run first)."""

from __future__ import annotations

from pathlib import Path

import typer

from inferplane.cli.main import app


@app.command()
def apply(
    directory: Path = typer.Argument(..., help="A directory from `inferplane render`."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only the server-side dry run."),
) -> None:
    """Apply rendered manifests to the current cluster (server-side apply, dry run first)."""
    from inferplane.deploy.apply import apply_dir

    applied = apply_dir(directory, dry_run_only=dry_run)
    verb = "validated (dry run)" if dry_run else "applied"
    typer.echo(f"{verb} {len(applied)} objects from {directory}")
