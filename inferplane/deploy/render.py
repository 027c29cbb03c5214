"""`render(fleet, plan, target, out_dir)`: write a deterministic directory of deploy files."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Literal

from inferplane.deploy.options import RenderOptions
from inferplane.deploy.yamlio import dump_docs, write_atomic
from inferplane.errors import InferplaneError
from inferplane.planner.plan import Plan
from inferplane.spec import FleetSpec

Target = Literal["k8s", "compose", "systemd"]
TARGETS: tuple[Target, ...] = ("k8s", "compose", "systemd")

HEADER = "# Rendered by `inferplane render` from the plan; edit the fleet file, not this file.\n"


def _fleet_text(plan: Plan, options: RenderOptions) -> str:
    if options.fleet_text is not None:
        return options.fleet_text
    path = Path(plan.fleet_file)
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InferplaneError(
            "cannot read the fleet file the plan was made from (the gateway needs it)",
            field="plan.fleet_file",
            value=plan.fleet_file,
            fix="render from the fleet file itself, or pass its text as options.fleet_text",
        ) from exc


def render_files(
    fleet: FleetSpec, plan: Plan, target: str, options: RenderOptions
) -> dict[str, str]:
    """Relative path -> file content, nothing written."""
    fleet_text = _fleet_text(plan, options)
    if target == "k8s":
        from inferplane.deploy.k8s import render_k8s

        docs = render_k8s(fleet, plan, options, fleet_text)
        return {path: HEADER + dump_docs(objs) for path, objs in sorted(docs.items())}
    if target == "compose":
        from inferplane.deploy.compose import render_compose

        return render_compose(fleet, plan, options, fleet_text)
    if target == "systemd":
        from inferplane.deploy.systemd import render_systemd

        return render_systemd(fleet, plan, options, fleet_text)
    raise InferplaneError(
        "unknown render target", field="--target", value=target,
        fix=f"use one of: {', '.join(TARGETS)}",
    )


def render_warnings(
    fleet: FleetSpec, plan: Plan, target: str, options: RenderOptions
) -> list[str]:
    """What the `target` cannot express of the fleet file (Kubernetes: every field the
    render does not carry, `k8s/coverage.py`); `render` writes the files regardless."""
    if target != "k8s":
        return []
    from inferplane.deploy.k8s import coverage
    from inferplane.deploy.k8s.context import K8sContext

    return coverage.warnings(K8sContext(fleet, plan, options))


def render(
    fleet: FleetSpec,
    plan: Plan,
    target: str,
    out_dir: Path,
    *,
    namespace: str | None = None,
    k8s_version: str | None = None,
    options: RenderOptions | None = None,
) -> list[Path]:
    """Write the files for `target` under `out_dir` (each atomically); return their paths.

    Same fleet and plan, same bytes: keys are sorted, nothing depends on time or order of
    discovery. Files from an earlier render that this one does not produce are left alone
    (for Kubernetes, `kustomization.yaml` lists exactly the current ones).
    """
    opts = options or RenderOptions()
    if namespace is not None:
        opts = replace(opts, namespace=namespace)
    if k8s_version is not None:
        opts = replace(opts, k8s_version=k8s_version)
    files = render_files(fleet, plan, target, opts)
    if out_dir.exists() and not out_dir.is_dir():
        raise InferplaneError(
            "the output path exists and is not a directory", field="--out",
            value=str(out_dir), fix="choose a directory",
        )
    written: list[Path] = []
    for rel, text in sorted(files.items()):
        path = out_dir / rel
        write_atomic(path, text)
        written.append(path)
    return written
