"""`inferplane up`: run a fleet on this host — engines, supervision, the gateway in front."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from inferplane.cli.main import app
from inferplane.cli.options import STATE_DIR_ENV
from inferplane.cli.progress import FleetProgress
from inferplane.cli.tables import Col, fitted_table
from inferplane.errors import InferplaneError
from inferplane.runtime.defaults import DEFAULT_GRACE_PERIOD_S

if TYPE_CHECKING:
    from inferplane.spec import FleetSpec

console = Console(highlight=False)  # Rich's highlighter colours digits inside names
KEEP_TOKEN_ENV = "INFERPLANE_KEEP_ADMIN_TOKEN"  # set for the detached child only
STOP_INTERRUPTED_S = 60.0  # Ctrl-C during `up --detach`: how long the stop may take


STATUS_COLUMNS = (
    Col("instance"), Col("model", drop=9), Col("state"), Col("pid", drop=8),
    Col("port", drop=3), Col("gpus", drop=7), Col("restarts", "rst", drop=5),
    Col("uptime", "up", drop=2), Col("waiting", "wait", drop=6), Col("running", "run", drop=1),
    Col("kv cache", "kv", drop=4),
)  # fmt: skip


def say(out: Console, text: str) -> None:
    """One message, never broken into lines by Rich (paths and URLs stay whole)."""
    out.print(text, highlight=False, soft_wrap=True)


def print_status(status: dict[str, Any], out: Console | None = None) -> None:
    """The instance table plus the gateway URL (shared by `up` and `status`); at 80
    columns it hides the least useful columns first (see `inferplane.cli.tables`)."""
    out = out or console
    rows: list[list[str]] = []
    from inferplane.runtime.labels import gpus_label

    for inst in status.get("instances", []):
        gpus = gpus_label(inst, status.get("instances", []))
        uptime = inst.get("uptime_s")
        if uptime is None and inst.get("ready_since") and inst["state"] == "ready":
            uptime = time.time() - inst["ready_since"]
        kv = inst.get("kv_cache_usage")
        state = f"asleep (L{inst['sleep_level']})" if inst.get("sleep_level") else inst["state"]
        if inst.get("check_error"):
            state += " (unchecked)"  # the supervisor cannot probe it now; see below
        rows.append([
            inst["name"], inst["model"], state, str(inst["pid"] or "-"),
            str(inst["port"]), gpus, str(inst["restarts"]), _duration(uptime),
            _count(inst.get("waiting")), _count(inst.get("running")),
            "-" if kv is None else f"{kv:.0%}",
        ])  # fmt: skip
    for ep in status.get("endpoint_models", []):
        rows.append([f"{ep['model']} (endpoint)", ep["model"], "external", *["-"] * 8])
    title = f"fleet ({status.get('phase', '?')})"
    out.print(fitted_table(STATUS_COLUMNS, rows, out.width, title))
    for ep in status.get("endpoint_models", []):
        say(out, f"{ep['model']}: served by {', '.join(ep['endpoints'])}")
    for inst in status.get("instances", []):
        if "adapters" in inst:  # LoRA: which replica holds which adapter
            held = inst["adapters"]
            say(out, f"{inst['name']} adapters: "
                + ("unknown (no answer)" if held is None else ", ".join(held) or "none"))
    for inst in status.get("instances", []):
        if inst.get("check_error"):
            say(out, f"{inst['name']}: the supervisor cannot check it: {inst['check_error']} "
                "(it retries with backoff; the state shown is the last one it saw)")
    if status.get("phase") == "stopped":  # nothing answers there: no URL to open
        say(out, f"gateway: not running (it served {status['gateway']['url']}/v1 until "
            "stopped); start the fleet with `inferplane up FLEET.yaml`")
        return
    say(out, f"gateway: {status['gateway']['url']}/v1")
    if status["gateway"].get("console"):  # docs/console.md
        say(out, f"console: {status['gateway']['url']}/ui{_console_access(status)}")
    if status.get("monitoring_dir"):  # docs/monitoring.md
        say(out, f"monitoring: prometheus --config.file={status['monitoring_dir']}/prometheus.yml")
    tenancy = status.get("tenancy")
    if tenancy:
        auth = "ON" if tenancy.get("auth_required") else "OFF"
        say(
            out, f"auth: {auth} (gateway.auth: {tenancy.get('auth')}); keys and usage: "
            f"{tenancy.get('database')}",
        )
    elif "tenancy" in status:
        say(out, "tenancy: off (no API keys, limits or usage ledger)")
    for model, sc in ((status.get("scaling") or {}).get("models") or {}).items():
        last = sc.get("last_decision")
        asleep = f", {sc['asleep']} asleep" if sc.get("asleep") else ""
        say(out, f"scaling {model}: {sc['current']} awake, desired {sc['desired']} "
            f"[{sc['min_replicas']}..{sc['max_replicas']}]{asleep}"
            + (f"; last {last['action']}: {last['reason']}" if last else "")
            + " (inferplane events)")
    for pair in (status.get("scaling") or {}).get("not_awake_together") or []:
        say(out, f"{' and '.join(pair)} cannot be awake together here: they swap")
    failed = [i for i in status.get("instances", []) if i["state"] == "failed"]
    for inst in failed:
        say(out, f"[red]{inst['name']} failed:[/] {inst['last_error']}")


def _console_access(status: dict[str, Any]) -> str:
    """Who may open the console, as inferplane.console.auth decides it."""
    tenancy = status.get("tenancy")
    if not tenancy or "admin_token" not in tenancy:  # no tenancy, or an older state.json
        return ""
    env = tenancy.get("admin_token_env") or "INFERPLANE_ADMIN_TOKEN"
    generated = tenancy.get("admin_token_file")
    if tenancy["admin_token"]:
        return (f" (sign in with the admin token in {generated})" if generated
                else f" (sign in with the admin token, ${env})")
    if tenancy.get("auth_required"):
        return f" (refused until ${env} is set: auth is on)"
    return ""


def _stop_interrupted(pid: int, state_dir: Path | None) -> None:
    """Ctrl-C during `up --detach`: stop the fleet that was starting, not leave it behind."""
    from inferplane.runtime import control

    say(console, f"interrupted: stopping the fleet starting in the background (pid {pid}); "
        "Ctrl-C again leaves it running")
    try:
        stopped = control.stop_starting(pid, STOP_INTERRUPTED_S)
    except KeyboardInterrupt:
        stopped = False
    if stopped:
        say(console, "fleet stopped")
        raise typer.Exit(130)
    where = "" if state_dir is None else f" --state-dir {state_dir}"
    say(console, f"the fleet (pid {pid}) goes on in the background; stop it with "
        f"`inferplane down{where}`")
    raise typer.Exit(130)


def _console_token(spec: FleetSpec, state_path: Path, tenancy: bool) -> str | None:
    """A console admin token for this run when none is set (inferplane.runtime.admin_token)."""
    from inferplane.runtime import admin_token

    if os.environ.get(KEEP_TOKEN_ENV):  # a detached child: its parent made and printed it
        return None
    if spec.gateway.console and tenancy and not os.environ.get(spec.gateway.admin_token_env):
        return admin_token.generate(state_path)
    admin_token.forget(state_path)
    return None


def _say_token(token: str | None, spec: FleetSpec, state_path: Path) -> None:
    """Printed once, here: only the file keeps it."""
    if token is None:
        return
    from inferplane.runtime.admin_token import admin_token_path

    say(console, f"console admin token: {token}\n  (generated: "
        f"${spec.gateway.admin_token_env} is unset; the console asks for it once auth is on, "
        f"e.g. after the first `inferplane keys create`; kept in "
        f"{admin_token_path(state_path)}, mode 0600)")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


@app.command()
def up(
    fleet: Path = typer.Argument(..., help="Fleet file (see docs/fleet-file.md)."),
    detach: bool = typer.Option(False, "--detach", "-d", help="Run in the background."),
    state_dir: Path | None = typer.Option(
        None, envvar=STATE_DIR_ENV, show_default=False,
        help="Pid file, state.json and logs (default: $INFERPLANE_STATE_DIR, else "
        "./.inferplane). Other commands find a running fleet without it.",
    ),
    grace_period_s: float = typer.Option(
        DEFAULT_GRACE_PERIOD_S, help="How long in-flight requests may finish on stop (P27)."
    ),
    gateway_port: int | None = typer.Option(
        None, help="Gateway port (default: the fleet's gateway.port; 0 = any free port)."
    ),
    ready_timeout_s: float = typer.Option(600.0, help="With --detach: wait this long."),
    plan: Path | None = typer.Option(
        None, help="engine: vllm: a plan from `inferplane plan --out` (default: plan now)."
    ),
    node: str | None = typer.Option(
        None, help="engine: vllm: the inventory node this host is (default: the only one)."
    ),
    vllm_binary: str | None = typer.Option(
        None, envvar="INFERPLANE_VLLM_BINARY",
        help="Command run instead of `vllm`, e.g. \"python -m "
        "inferplane.sim.fake_vllm\" to run a vLLM fleet on the simulator.",
    ),
    disk_bandwidth_mib_s: float = typer.Option(
        100.0, help="Read bandwidth of the weights' disk: sizes startup deadlines (P24, P35)."
    ),
    db: str | None = typer.Option(
        None, "--db",
        help="Keys/usage/routes database URL, or @FILE holding it (default: "
        "$INFERPLANE_DATABASE_URL(_FILE), the fleet's gateway.database_url, else "
        "STATE_DIR/inferplane.db).",
    ),
    tenancy: bool = typer.Option(
        True, help="API keys, limits, usage ledger and DB routes in the gateway."
    ),
    monitoring: Path | None = typer.Option(
        None, "--monitoring", show_default=False,
        help="Write the Prometheus config (live scrape targets), alert rules and Grafana "
        "dashboard here (default: STATE_DIR/monitoring; docs/monitoring.md).",
    ),
    web_console: bool = typer.Option(
        True, "--console/--no-console",
        help="Serve the web console at GATEWAY/ui; --no-console (or the fleet's "
        "gateway.console: false) turns it off.",
    ),
) -> None:
    """Start every engine instance of FLEET and the gateway; Ctrl-C drains and stops."""
    from inferplane.runtime import control
    from inferplane.runtime.registry import up_state_dir
    from inferplane.runtime.runner import RuntimeOptions
    from inferplane.runtime.vllm_fleet import load_plan, startup_deadline_s
    from inferplane.spec import load_fleet

    spec = load_fleet(fleet)
    state = up_state_dir(state_dir)
    other = state.running_pid()
    # Refused here, before the plan is made and printed (a page of tables and warnings that
    # buried this one line); the runtime's claim checks again when it takes the directory.
    if other is not None and other != os.getpid():
        raise InferplaneError(
            f"a fleet is already running from this state directory (pid {other})",
            field="--state-dir", value=str(state.path),
            fix="stop it with `inferplane down`, or pass another --state-dir",
        )
    if not web_console:
        gateway = spec.gateway.model_copy(update={"console": False})
        spec = spec.model_copy(update={"gateway": gateway})
    startup_deadline_s(0, disk_bandwidth_mib_s)  # refuses a bandwidth that is not positive
    given_plan = load_plan(plan) if plan is not None else None
    if given_plan is None and spec.gpus is not None and any(
        m.replicas for m in spec.placed_models
    ):
        from inferplane.planner.build import plan_fleet

        given_plan = plan_fleet(spec, fleet_file=str(fleet.resolve()))
    if given_plan is not None:
        from inferplane.cli.plan import print_plan

        print_plan(given_plan, console)  # what is about to run, card by card
    if grace_period_s < 0:
        raise InferplaneError(
            "grace period cannot be negative", field="--grace-period-s",
            value=grace_period_s, fix="use 0 (stop at once) or more seconds",
        )
    token = _console_token(spec, state.path, tenancy)
    if detach:
        import signal

        # Ctrl-C raises KeyboardInterrupt again (below): the planner's CP-SAT solve leaves
        # SIGINT at the default action, which killed this process and left the child going
        signal.signal(signal.SIGINT, signal.default_int_handler)
        argv = [
            *control.python_argv(), "up", str(fleet.resolve()), "--state-dir", str(state.path),
            "--grace-period-s", str(grace_period_s),
        ]
        if gateway_port is not None:
            argv += ["--gateway-port", str(gateway_port)]
        if given_plan is not None:  # the child runs exactly the plan printed above
            from inferplane.deploy.yamlio import write_atomic

            planned = state.path / "planned.json"
            write_atomic(planned, given_plan.model_dump_json(indent=2) + "\n")
            os.chmod(planned, 0o600)  # the state directory's files are the owner's only
            argv += ["--plan", str(planned)]
        if node is not None:
            argv += ["--node", node]
        if vllm_binary is not None:
            argv += ["--vllm-binary", vllm_binary]
        argv += ["--disk-bandwidth-mib-s", str(disk_bandwidth_mib_s)]
        if db is not None:
            argv += ["--db", db]
        if not tenancy:
            argv.append("--no-tenancy")
        if monitoring is not None:
            argv += ["--monitoring", str(monitoring.resolve())]
        if not web_console:
            argv.append("--no-console")
        offset = control.log_size(state)
        # the child keeps the token printed here (and never writes it to up.log)
        pid = control.spawn_detached(argv, state, {KEEP_TOKEN_ENV: "1"} if token else None)
        progress = FleetProgress(console)
        try:
            status = control.wait_detached_ready(
                state, pid, ready_timeout_s, offset, progress.update
            )
        except KeyboardInterrupt:  # the child is in its own session: it did not see it
            progress.close()
            _stop_interrupted(pid, state_dir)
        finally:
            progress.close()
        print_status(status)
        _say_token(token, spec, state.path)
        say(
            console, f"running in the background (pid {pid}); stop with `inferplane down"
            + ("" if state_dir is None else f" --state-dir {state_dir}") + "`; `inferplane "
            "status`, `logs`, `keys` and `usage` find it from any shell",
        )
        return
    options = RuntimeOptions(
        state_dir=state.path, grace_period_s=grace_period_s, gateway_port=gateway_port,
        fleet_path=str(fleet.resolve()), plan=given_plan, node=node, vllm_binary=vllm_binary,
        disk_bandwidth_mib_s=disk_bandwidth_mib_s, tenancy=tenancy, database_url=db,
        monitoring_dir=monitoring.resolve() if monitoring is not None else None,
    )

    progress = FleetProgress(console, grace_period_s)

    def on_ready(status: dict[str, Any]) -> None:
        progress.update(status)  # the last transitions (ready, failed)
        progress.close()
        print_status(status)
        _say_token(token, spec, state.path)
        say(console, "serving; Ctrl-C drains and stops (twice forces)")
        sys.stdout.flush()

    def on_progress(status: dict[str, Any]) -> None:
        progress.update(status)
        sys.stdout.flush()

    try:
        code = asyncio.run(control.run_foreground(spec, options, on_ready, on_progress))
    finally:
        progress.close()
    raise typer.Exit(code)



