"""`inferplane render`: the fleet as Kubernetes manifests, docker compose files or systemd units."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import typer

from inferplane.cli.main import app
from inferplane.errors import USAGE_EXIT_CODE, InferplaneError


@app.command()
def render(
    fleet: Path | None = typer.Argument(None, help="Fleet file (omit with --check)."),
    target: str = typer.Option("k8s", "--target", help="k8s | compose | systemd"),
    out: Path | None = typer.Option(None, "--out", help="Directory to write."),
    plan: Path | None = typer.Option(
        None, "--plan", help="A saved plan (JSON); default: plan now."),
    namespace: str = typer.Option("inferplane", "--namespace", help="Kubernetes namespace."),
    k8s_version: str = typer.Option("1.30", "--k8s-version", help="Oldest cluster version."),
    autoscaler: str = typer.Option("keda", "--autoscaler", help="keda | hpa | none"),
    ingress_host: str | None = typer.Option(None, "--ingress-host",
                                            help="Render an Ingress for this host."),
    disk_read_mib_s: float = typer.Option(
        200.0, "--disk-read-mib-s", help="Model store read speed, for startup budgets (P24)."),
    gateway_image: str | None = typer.Option(
        None, "--gateway-image", help="Image with inferplane installed (default: the fleet's "
        "gateway.image, else what the repository's Dockerfile builds, "
        "ghcr.io/inferplane/inferplane:VERSION)."),
    weights: str = typer.Option(
        "none", "--weights",
        help="Model weights (P35): none (hostPath/HF cache) | pvc (ReadOnlyMany PVC per "
             "model; k8s only) | prewarm (copied to node-local disk first: a DaemonSet, a "
             "compose service or a systemd oneshot unit)."),
    weights_storage_class: str | None = typer.Option(
        None, "--weights-storage-class", help="StorageClass of the weights PVCs."),
    gang: str = typer.Option(
        "none", "--gang", help="Gang scheduling for multi-GPU models and replicas that span "
                               "nodes (P15, k8s only): kueue | volcano | none."),
    gang_queue: str = typer.Option(
        "default", "--gang-queue", help="Kueue LocalQueue or Volcano Queue name."),
    inference_pool: bool = typer.Option(
        False, "--inference-pool", help="k8s: also an InferencePool (Gateway API Inference "
        "Extension v1) per model, for a GIE-capable Gateway (docs/deploy.md)."),
    epp_image: str | None = typer.Option(
        None, "--epp-image", help="With --inference-pool: run an endpoint picker per pool "
        "from this image (default: none rendered; install your own)."),
    check: Path | None = typer.Option(None, "--check", help="Validate this rendered directory."),
    image_archive: Path | None = typer.Option(
        None, "--image-archive", help="With --check: also warn when this image archive "
        "(scripts/build-image.sh --archive) does not hold the rendered tag or was built "
        "from another version or revision than this checkout."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON result."),
) -> None:
    """Render the fleet's plan for Kubernetes, docker compose or systemd; or --check a dir."""
    from inferplane.deploy import RenderOptions, check_dir
    from inferplane.deploy import render as do_render
    from inferplane.deploy.checks import DEFAULT_K8S_VERSIONS
    from inferplane.deploy.options import k8s_minor

    if check is not None:
        k8s_minor(k8s_version)
        versions = tuple(sorted({*DEFAULT_K8S_VERSIONS, k8s_version},
                                key=lambda v: k8s_minor(v)))
        problems = check_dir(check, versions)
        from inferplane.deploy.images import image_warnings

        warnings = image_warnings(check)  # reported, but the directory stays valid
        if image_archive is not None:
            from inferplane.deploy.image_archive import checked_archive_warnings

            warnings += checked_archive_warnings(image_archive, check)
        if as_json:
            typer.echo(json.dumps({"dir": str(check), "valid": not problems,
                                   "versions": list(versions),
                                   "problems": [p.render() for p in problems],
                                   "warnings": warnings}))
        else:
            for warning in warnings:
                typer.echo(f"warning: {warning}", err=True)
            for problem in problems:
                typer.echo(problem.render())
            state = "invalid" if problems else "ok"
            k8s = (check / "kustomization.yaml").is_file()
            schemas = f" (Kubernetes {', '.join(versions)})" if k8s else ""
            typer.echo(f"{state} {check}: {len(problems)} problems{schemas}")
        if problems:
            raise typer.Exit(USAGE_EXIT_CODE)
        return
    if image_archive is not None:
        raise InferplaneError("--image-archive goes with --check", field="--image-archive",
                              value=str(image_archive),
                              fix="inferplane render --check DIR --image-archive FILE")
    if fleet is None or out is None:
        raise InferplaneError("render needs a fleet file and --out", field="FLEET",
                              fix="inferplane render FLEET.yaml --target k8s --out DIR "
                                  "(or --check DIR)")
    if autoscaler not in ("keda", "hpa", "none"):
        raise InferplaneError("unknown autoscaler", field="--autoscaler", value=autoscaler,
                              fix="use keda, hpa or none")
    from inferplane.spec import load_fleet

    spec = load_fleet(fleet)
    if plan is not None:
        from inferplane.cli.plan_file import load_plan

        the_plan = load_plan(plan)
    else:
        try:
            from inferplane.planner.build import plan_fleet
        except ImportError as exc:
            raise InferplaneError("the planner is not available in this build",
                                  field="--plan",
                                  fix="pass a saved plan with --plan plan.json") from exc
        the_plan = plan_fleet(spec, fleet_file=str(fleet))
    from inferplane.planner.plan import Plan

    assert isinstance(the_plan, Plan)
    from inferplane.deploy.options import GANG_SCHEDULERS, WEIGHTS_MODES

    weights_mode = next((m for m in WEIGHTS_MODES if m == weights), None)
    if weights_mode is None:
        raise InferplaneError("unknown weights mode", field="--weights", value=weights,
                              fix=f"use one of: {', '.join(WEIGHTS_MODES)}")
    gang_mode = next((g for g in GANG_SCHEDULERS if g == gang), None)
    if gang_mode is None:
        raise InferplaneError("unknown gang scheduler", field="--gang", value=gang,
                              fix=f"use one of: {', '.join(GANG_SCHEDULERS)}")
    options = RenderOptions(
        namespace=namespace, k8s_version=k8s_version,
        autoscaler="keda" if autoscaler == "keda" else "hpa" if autoscaler == "hpa" else "none",
        ingress_host=ingress_host, disk_read_mib_s=disk_read_mib_s,
        fleet_text=fleet.read_text(encoding="utf-8"),
        weights=weights_mode, weights_storage_class=weights_storage_class,
        gang=gang_mode, gang_queue=gang_queue,
        inference_pool=inference_pool, epp_image=epp_image,
    )
    image = gateway_image or spec.gateway.image  # the flag, the fleet file, the default
    if image:
        options = replace(options, gateway_image=image)
    written = do_render(spec, the_plan, target, out, options=options)
    from inferplane.deploy.render import render_warnings

    lost = render_warnings(spec, the_plan, target, options)
    if as_json:
        typer.echo(json.dumps({"target": target, "out": str(out),
                               "files": [str(p.relative_to(out)) for p in written],
                               "warnings": lost}))
    else:
        for warning in lost:
            typer.echo(f"warning: {warning}", err=True)
        typer.echo(f"wrote {len(written)} files to {out} (target {target})")
