"""systemd: one unit per plan instance, the gateway, and a target grouping them, per node.

`Restart=always`, `LimitNOFILE` (P30), an explicit `CUDA_VISIBLE_DEVICES` with the plan's
integer indices (P20, P21), `TimeoutStartSec` from the startup budget (P24) and
`TimeoutStopSec` longer than vLLM's drain (P27). A unit that starts after another waits
for its `/health` in `ExecStartPre` (S0's order), not just for the process.
"""

from __future__ import annotations

import re
from pathlib import Path

from inferplane.deploy.checks import CheckProblem, run_quiet, systemd_analyze
from inferplane.deploy.names import object_name
from inferplane.deploy.options import RenderOptions, supports_shutdown_timeout
from inferplane.planner.plan import Plan, PlanInstance
from inferplane.spec import FleetSpec

TARGET = "inferplane.target"
HEADER = "# Rendered by `inferplane render --target systemd`; edit the fleet file instead.\n"
_SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def quote(arg: str) -> str:
    """One argv element in systemd's command-line syntax: `%` and `$` are specifiers and
    variables there, so they are doubled; anything else unusual goes in double quotes."""
    text = arg.replace("%", "%%").replace("$", "$$")
    if text and _SAFE.match(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def unit_name(instance_id: str) -> str:
    return f"inferplane-{object_name(instance_id, max_chars=200)}.service"


def _exec(argv: list[str]) -> str:
    first = argv[0] if argv[0].startswith("/") else "/usr/bin/env"
    rest = argv[1:] if argv[0].startswith("/") else argv
    return " ".join([first, *(quote(a) for a in rest)])


def engine_unit(fleet: FleetSpec, plan: Plan, inst: PlanInstance, options: RenderOptions) -> str:
    argv = list(inst.argv)
    if "--host" in argv and len({i.node for i in plan.instances}) > 1:
        argv[argv.index("--host") + 1] = "0.0.0.0"  # the gateway on another node reaches it
    engine = fleet.engine
    if supports_shutdown_timeout(engine.kind, engine.version) and "--shutdown-timeout" not in argv:
        argv += ["--shutdown-timeout", str(options.drain_s)]
    env = dict(inst.env)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in inst.gpu_indices)
    deps = [d for d in inst.start_after
            if any(i.id == d and i.node == inst.node for i in plan.instances)]
    after = " ".join(["network-online.target", *(unit_name(d) for d in deps)])
    lines = [
        HEADER.rstrip("\n"),
        "[Unit]",
        f"Description=inferplane {inst.model} replica {inst.replica} "
        f"(GPUs {','.join(str(i) for i in inst.gpu_indices)}, port {inst.port})",
        f"After={after}",
        "Wants=network-online.target",
        *([f"Requires={' '.join(unit_name(d) for d in deps)}"] if deps else []),
        f"PartOf={TARGET}",
        "",
        "[Service]",
        "Type=simple",
        *(f"Environment={quote(f'{k}={v}')}" for k, v in sorted(env.items())),
    ]
    for dep in deps:
        port = plan.instance(dep).port
        wait = f"until curl -sf http://127.0.0.1:{port}/health >/dev/null; do sleep 5; done"
        lines.append(f"ExecStartPre=/bin/sh -c {quote(wait)}")
    budget = options.startup_budget_s(inst.weights_bytes) + sum(
        options.startup_budget_s(plan.instance(d).weights_bytes) for d in deps)
    lines += [
        f"ExecStart={_exec(argv)}",
        "KillSignal=SIGTERM",
        "KillMode=mixed",
        f"TimeoutStartSec={budget}",
        f"TimeoutStopSec={options.drain_s + options.grace_margin_s}",
        "Restart=always",
        "RestartSec=10",
        f"LimitNOFILE={options.nofile}",
        "",
        "[Install]",
        f"WantedBy={TARGET}",
        "",
    ]
    return "\n".join(lines)


def gateway_unit(fleet: FleetSpec, plan: Plan, node: str, options: RenderOptions) -> str:
    argv = ["inferplane", "gateway", "--fleet", options.fleet_file_path, "--host",
            fleet.gateway.host, "--port", str(fleet.gateway.port)]
    for inst in plan.instances:
        host = "127.0.0.1" if inst.node == node else inst.node
        argv += ["--backend", f"{inst.model}=http://{host}:{inst.port}"]
    return "\n".join([
        HEADER.rstrip("\n"),
        "[Unit]",
        "Description=inferplane gateway",
        "After=network-online.target",
        "Wants=network-online.target",
        f"PartOf={TARGET}",
        "",
        "[Service]",
        "Type=simple",
        f"ExecStart={_exec(argv)}",
        "KillSignal=SIGTERM",
        f"TimeoutStopSec={options.prestop_sleep_s + options.drain_s}",
        "Restart=always",
        "RestartSec=5",
        f"LimitNOFILE={options.nofile}",
        "",
        "[Install]",
        f"WantedBy={TARGET}",
        "",
    ])


def render_systemd(
    fleet: FleetSpec, plan: Plan, options: RenderOptions, fleet_text: str
) -> dict[str, str]:
    nodes: list[str] = []
    for inst in plan.instances:
        if inst.node not in nodes:
            nodes.append(inst.node)
    files: dict[str, str] = {}
    for n, node in enumerate(nodes):
        units: list[str] = []
        base = object_name(node)
        for inst in plan.instances:
            if inst.node == node:
                name = unit_name(inst.id)
                files[f"{base}/{name}"] = engine_unit(fleet, plan, inst, options)
                units.append(name)
        if n == 0:
            files[f"{base}/inferplane-gateway.service"] = gateway_unit(fleet, plan, node, options)
            files[f"{base}/fleet.yaml"] = fleet_text
            units.append("inferplane-gateway.service")
        files[f"{base}/{TARGET}"] = "\n".join([
            HEADER.rstrip("\n"),
            "[Unit]",
            f"Description=inferplane fleet on {node}",
            f"Wants={' '.join(sorted(units))}",
            "",
            "[Install]",
            "WantedBy=multi-user.target",
            "",
        ])
    return files


def check_units(root: Path) -> list[CheckProblem]:
    """Own checks on every unit, then `systemd-analyze verify` where it exists."""
    problems: list[CheckProblem] = []
    for path in sorted(root.rglob("*.service")):
        rel = str(path.relative_to(root))
        text = path.read_text(encoding="utf-8")
        for key in ("ExecStart=", "Restart=always", "LimitNOFILE=", "TimeoutStopSec="):
            if f"\n{key}" not in text:
                problems.append(CheckProblem(rel, "", f"missing {key.rstrip('=')}"))
    tool = systemd_analyze()
    if tool is None:
        return problems
    for node_dir in sorted({p.parent for p in root.rglob("*.service")}):
        units = sorted(str(p) for p in node_dir.glob("*.service"))
        result = run_quiet([tool, "verify", "--man=no", *units])
        for line in (result.stdout + result.stderr).splitlines():
            line = line.strip()
            if not line or _ignorable(line):
                continue
            problems.append(CheckProblem(str(node_dir.relative_to(root)), "systemd-analyze",
                                         line))
    return problems


def _ignorable(line: str) -> bool:
    # Missing /usr/bin/env targets and units not installed on this machine are not errors
    # in the rendered files themselves.
    return any(s in line for s in (
        "inferplane.target", "Failed to prepare filename", "not found", "Unit is bound to "
        "inactive unit", "Failed to create", "Command /usr/bin/env is not executable",
        "is not executable",
    ))
