"""`inferplane monitoring [FLEET] --out DIR`: Prometheus and Grafana files for one host."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from inferplane.cli.main import app
from inferplane.cli.options import state_dir_option
from inferplane.errors import InferplaneError

if TYPE_CHECKING:
    from inferplane.monitoring.targets import Target
    from inferplane.planner.plan import Plan
    from inferplane.runtime.state import StateDir
    from inferplane.spec import FleetSpec

ENGINE_HOST = "127.0.0.1"  # = inferplane.runtime.instances.ENGINE_HOST (light import here)


@app.command()
def monitoring(
    fleet: Path | None = typer.Argument(
        None, help="Fleet file (default: the running fleet's, found as `status` finds it)."
    ),
    out: Path = typer.Option(..., "--out", "-o", help="Directory to write the files into."),
    plan: Path | None = typer.Option(
        None, help="A plan from `inferplane plan --out` (default: the running fleet's, else "
        "plan FLEET now)."
    ),
    state_dir: Path | None = state_dir_option(),
    as_json: bool = typer.Option(False, "--json", help="Print what was written as JSON."),
) -> None:
    """Write a Prometheus config scraping the gateway and every engine, the P49 alert rules
    and the Grafana dashboard (the same as `inferplane render`'s). With a running fleet the
    scrape targets are its live file_sd files, rewritten as replicas change."""
    from inferplane.monitoring.files import NAMESPACE, monitoring_files
    from inferplane.monitoring.live import targets_of
    from inferplane.monitoring.targets import GATEWAY_TARGETS, TargetsWriter, file_sd
    from inferplane.spec import load_fleet

    state = _state_dir(fleet, state_dir)
    status = state.read() if state.running_pid() is not None else None
    if fleet is None:
        if status is None or not status.get("fleet"):
            raise InferplaneError(
                f"no fleet file given and no fleet running from {state.path}",
                field="FLEET", fix="pass the fleet file, or start it with `inferplane up`",
            )
        fleet = Path(status["fleet"])
    elif status is not None and status.get("fleet") != str(fleet.resolve()):
        status = None  # another fleet runs there: use FLEET's plan, not its live targets
    spec = load_fleet(fleet)
    the_plan = _plan(spec, fleet, plan, state.path if status is not None else None)
    live = Path(status["monitoring_dir"]) / "targets" if status and status.get(
        "monitoring_dir"
    ) else None
    token, token_note = _metrics_token(spec)
    files = monitoring_files(
        spec, the_plan, out, targets_dir=live,
        metrics_token_file="gateway-metrics-token" if token else None,
    )  # fmt: skip
    written = [str(p) for p in files.write(out)]
    if token:
        fd = os.open(out / "gateway-metrics-token", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(token + "\n")
        written.append(str(out / "gateway-metrics-token"))
    notes = [token_note] if token_note else []
    if live is not None and status is not None:
        gateway, engines = targets_of(status)
        notes.append(f"scrape targets: the running fleet's live files in {live}")
    else:
        gateway, engines = _planned_targets(spec, the_plan)
        writer = TargetsWriter(out, NAMESPACE)
        writer.update(gateway, engines)
        written += [str(out / GATEWAY_TARGETS), str(out / "targets/engines.json")]
        if spec.engine.kind == "sim":
            notes.append(
                "engine: sim picks engine ports at start: no engine targets yet; run "
                "`inferplane up` (it keeps STATE_DIR/monitoring current) and run this again"
            )
    doc: dict[str, Any] = {
        "out": str(out.resolve()),
        "files": written,
        "live_targets": str(live) if live is not None else None,
        "targets": {
            "gateway": file_sd(gateway, NAMESPACE),
            "engines": file_sd(engines, NAMESPACE),
        },
        "notes": notes,
        "prometheus": f"prometheus --config.file={out.resolve() / 'prometheus.yml'}",
    }
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    for path in written:
        typer.echo(f"wrote {path}")
    typer.echo(f"targets: gateway {len(gateway)}, engines {len(engines)}")
    for note in notes:
        typer.echo(f"note: {note}")
    typer.echo(f"run: {doc['prometheus']}  (Grafana: docs/monitoring.md)")


def _state_dir(fleet: Path | None, explicit: Path | None) -> StateDir:
    """The running fleet's directory as `status` finds it; given FLEET while several fleets
    run, the one started from FLEET, else none (the files then come from FLEET's plan: the
    other fleets are no reason to refuse)."""
    from inferplane.runtime.registry import find_state_dir, running_fleets, up_state_dir

    try:
        return find_state_dir(explicit)
    except InferplaneError:
        if fleet is None:
            raise
        for state in running_fleets():
            if (state.read() or {}).get("fleet") == str(fleet.resolve()):
                return state
        return up_state_dir(None)  # not running: no live targets


def _plan(spec: FleetSpec, fleet: Path, given: Path | None, running: Path | None) -> Plan:
    from inferplane.runtime.vllm_fleet import load_plan

    if given is not None:
        return load_plan(given)
    if running is not None and (running / "plan.json").is_file():
        return load_plan(running / "plan.json")  # what the running fleet was started with
    if spec.gpus is None or not spec.placed_models:
        raise InferplaneError(
            "the alert thresholds come from the plan (each replica's max_num_seqs), and "
            "this fleet has none", field="gpus",
            fix="list the fleet's GPUs under gpus: nodes, or pass --plan FILE",
        )
    from inferplane.planner.build import plan_fleet

    return plan_fleet(spec, fleet_file=str(fleet.resolve()))


def _planned_targets(spec: FleetSpec, plan: Plan) -> tuple[list[Target], list[Target]]:
    """Without a running fleet: the gateway's address from the fleet file and, for vLLM,
    each instance's port from the plan (engines on other nodes by node name)."""
    from inferplane.monitoring.targets import Target

    gw = spec.gateway
    gateway = [Target.from_url(f"http://{gw.host}:{gw.port}", "gateway", "gateway")]
    if spec.engine.kind != "vllm":
        return gateway, []
    nodes = {inst.node for inst in plan.instances}
    engines = [
        Target(
            f"{ENGINE_HOST if len(nodes) == 1 else inst.node}:{inst.port}", inst.id, "engine",
            inst.model,
        )
        for inst in plan.instances
    ]
    return gateway, engines


def _metrics_token(spec: FleetSpec) -> tuple[str | None, str | None]:
    name = spec.gateway.metrics_token_env
    if not name:
        return None, None
    token = os.environ.get(name)
    if token:
        return token, None
    return None, (
        f"gateway.metrics_token_env is {name} but it is not set here: Prometheus gets 401 "
        "from the gateway until you write the token to DIR/gateway-metrics-token and add "
        "authorization: {credentials_file: gateway-metrics-token} to its job"
    )
