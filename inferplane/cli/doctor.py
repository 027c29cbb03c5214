"""`inferplane doctor [--fleet FLEET.yaml] [--k8s] [--json]`: host and cluster checks."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from inferplane.cli.main import app
from inferplane.errors import USAGE_EXIT_CODE

_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


@app.command()
def doctor(
    fleet: Path | None = typer.Option(
        None, "--fleet", help="Also check this fleet's TP groups, model storage, flags and "
        "ports.", show_default=False,
    ),
    k8s: bool = typer.Option(False, "--k8s", help="Also check the cluster (kubeconfig): GPU "
                             "capacity per node, node labels, pending and terminating pods."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object (docs/diagnose.md)."),
    state_dir: Path | None = typer.Option(
        None, "--state-dir", help="The state directory to check, as `up` takes it (default: "
        "$INFERPLANE_STATE_DIR, else ./.inferplane).", show_default=False),
) -> None:
    """Check this host (driver vs wheels, GPUs, MIG, topology, ulimit, /dev/shm, disk, vLLM,
    NCCL, the gateway's and the engines' ports, the state directory) and optionally the
    cluster: each check passes, warns, fails or says why it was skipped. Exit 1 when a
    check fails."""
    from rich.console import Console
    from rich.markup import escape

    from inferplane.doctor.checks import SCHEMA, DoctorInput, run_checks
    from inferplane.doctor.host import LocalHost
    from inferplane.errors import InferplaneError

    spec = None
    if fleet is not None:
        from inferplane.spec import FleetValidationError, load_fleet

        try:
            spec = load_fleet(fleet)
        except FleetValidationError as exc:
            err = Console(stderr=True, highlight=False, soft_wrap=True)
            err.print(f"[bold red]invalid[/] {escape(str(fleet))}")
            for problem in exc.problems:
                err.print(f"  {escape(problem.render())}")
            raise typer.Exit(USAGE_EXIT_CODE) from None
    from inferplane.runtime.registry import up_state_dir

    inp = DoctorInput(LocalHost(), spec, state_dir=up_state_dir(state_dir).path)
    if k8s:
        from inferplane.doctor.k8s import KubernetesApi

        try:
            inp.cluster = KubernetesApi()
        except InferplaneError as exc:
            inp.cluster_error = exc.render()
    checks = run_checks(inp, k8s=k8s)
    if as_json:
        typer.echo(json.dumps({"schema": SCHEMA, "checks": [c.to_json() for c in checks]},
                              ensure_ascii=False))
    else:
        out = Console(highlight=False, soft_wrap=True)
        for check in checks:
            pid = f" ({check.pitfall})" if check.pitfall else ""
            out.print(f"[{_STYLE[check.status]}]{check.status:4}[/] {check.id}{pid}: "
                      f"{escape(check.summary)}")
            for line in check.evidence if check.status != "skip" else []:
                out.print(f"       [dim]{escape(line)}[/]")
            if check.fix and check.status in ("warn", "fail"):
                out.print(f"       [bold]fix:[/] {escape(check.fix)}")
        skipped = [c.id for c in checks if c.status == "skip"]
        if skipped:
            out.print(f"[dim]{len(skipped)} checks could not run here: {', '.join(skipped)} "
                      "(reasons above)[/]")
    if any(c.status == "fail" for c in checks):
        raise typer.Exit(1)
