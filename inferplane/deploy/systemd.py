"""systemd: one unit per plan instance, the gateway, and a target grouping them, per node.

`Restart=always`, `LimitNOFILE` (P30), an explicit `CUDA_VISIBLE_DEVICES` with the plan's
integer indices (P20, P21), `TimeoutStartSec` from the startup budget (P24) and
`TimeoutStopSec` longer than vLLM's drain (P27). A unit that starts after another waits
for its `/health` in `ExecStartPre` (S0's order), not just for the process.

A replica that spans nodes gets one unit per rank on each rank's node (`systemd_ranks`, with
a README.md saying which directory goes to which host); `--weights prewarm` a oneshot copy
unit per model (`systemd_prewarm`); Kubernetes-only options are refused (`hosts`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from inferplane.deploy import hosts, multinode
from inferplane.deploy.checks import CheckProblem, run_quiet, systemd_analyze
from inferplane.deploy.names import object_name
from inferplane.deploy.options import RenderOptions, supports_shutdown_timeout
from inferplane.deploy.systemd_prewarm import prewarm_of
from inferplane.deploy.systemd_syntax import HEADER, TARGET, exec_line, quote, unit_name
from inferplane.engines import engine_for
from inferplane.planner.plan import Plan, PlanInstance
from inferplane.spec import FleetSpec


def engine_unit(fleet: FleetSpec, plan: Plan, inst: PlanInstance, options: RenderOptions) -> str:
    engine = fleet.engine
    launch = engine_for(engine.kind).planned(inst.argv)
    if len(hosts.nodes_in_order(plan)) > 1:
        launch = launch.with_host("0.0.0.0")  # the gateway on another node reaches it
    if supports_shutdown_timeout(engine.kind, engine.version):
        launch = launch.with_drain_timeout(options.drain_s)
    argv = list(launch.argv)
    deps = [d for d in inst.start_after
            if any(i.id == d and i.node == inst.node for i in plan.instances)]
    where = f"GPUs {','.join(str(i) for i in inst.gpu_indices)}"
    if inst.cpu_cores:
        from inferplane.engines.vllm.cpu import threads_bind

        where = f"CPU cores {threads_bind(inst.cpu_cores)}"
    return unit_text(fleet, plan, options, inst, UnitBody(
        description=f"inferplane {inst.model} replica {inst.replica} ({where}, port "
                    f"{inst.port})",
        argv=argv, env=dict(inst.env), gpu_indices=inst.gpu_indices, deps=deps))


def _adapter_dirs(fleet: FleetSpec, inst: PlanInstance) -> list[str]:
    model = fleet.model(inst.model)
    return [a.source for a in model.lora.adapters] if model and model.lora else []


@dataclass(frozen=True)
class UnitBody:
    """What differs between engine units: a single-node instance or one rank of a replica."""

    description: str
    argv: list[str]
    env: dict[str, str]
    gpu_indices: list[int]
    deps: list[str] = field(default_factory=list)  # instance ids on this node to wait for
    exec_stop: str | None = None  # a shell line run before SIGTERM


def unit_text(fleet: FleetSpec, plan: Plan, options: RenderOptions, inst: PlanInstance,
              body: UnitBody) -> str:
    env = dict(body.env)
    cpu_lines: list[str] = []
    if inst.cpu_cores:  # a CPU engine: pinned to its cores, no GPU variables
        from inferplane.engines.vllm.cpu import systemd_lines

        cpu_lines = systemd_lines(inst.cpu_cores)
    else:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in body.gpu_indices)
    prewarm = prewarm_of(fleet, inst.model, options)
    if prewarm is not None:
        env.update(prewarm.env)
    after = ["network-online.target", *(unit_name(d) for d in body.deps)]
    requires = [unit_name(d) for d in body.deps]
    if prewarm is not None:
        after.append(prewarm.unit)
        requires.append(prewarm.unit)
    lines = [
        HEADER.rstrip("\n"),
        "[Unit]",
        f"Description={body.description}",
        f"After={' '.join(after)}",
        "Wants=network-online.target",
        *([f"Requires={' '.join(requires)}"] if requires else []),
        # the engine loads these adapters at start: a missing one fails the unit, named
        *(f"AssertPathIsDirectory={quote(path)}" for path in _adapter_dirs(fleet, inst)),
        f"PartOf={TARGET}",
        "",
        "[Service]",
        "Type=simple",
        *(f"Environment={quote(f'{k}={v}')}" for k, v in sorted(env.items())),
        *([f"BindReadOnlyPaths={quote(prewarm.bind)}"] if prewarm and prewarm.bind else []),
    ]
    for dep in body.deps:
        port = plan.instance(dep).port
        wait = f"until curl -sf http://127.0.0.1:{port}/health >/dev/null; do sleep 5; done"
        lines.append(f"ExecStartPre=/bin/sh -c {quote(wait)}")
    local = prewarm is not None
    budget = options.startup_budget_s(inst.weights_bytes, local=local) + sum(
        options.startup_budget_s(plan.instance(d).weights_bytes, local=local)
        for d in body.deps)
    lines += [
        f"ExecStart={exec_line(body.argv)}",
        *([f"ExecStop=/bin/sh -c {quote(body.exec_stop)}"] if body.exec_stop else []),
        "KillSignal=SIGTERM",
        "KillMode=mixed",
        f"TimeoutStartSec={budget}",
        f"TimeoutStopSec={options.drain_s + options.grace_margin_s}",
        "Restart=always",
        "RestartSec=10",
        f"LimitNOFILE={options.nofile}",
        *cpu_lines,
        "",
        "[Install]",
        f"WantedBy={TARGET}",
        "",
    ]
    return "\n".join(lines)


def gateway_unit(fleet: FleetSpec, plan: Plan, node: str, options: RenderOptions) -> str:
    argv = ["inferplane", "gateway", "--fleet", options.fleet_file_path, "--host",
            fleet.gateway.host, "--port", str(fleet.gateway.port)]
    for inst in plan.instances:  # a replica that spans nodes: its leader (inst.node)
        host = "127.0.0.1" if inst.node == node else hosts.host_of(fleet, inst.node)
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
        f"ExecStart={exec_line(argv)}",
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
    from inferplane.deploy import systemd_ranks
    from inferplane.deploy.systemd_prewarm import prewarm_unit

    hosts.refuse_cluster_options(fleet, plan, options, "systemd")
    nodes = hosts.nodes_in_order(plan)
    dirs = {node: object_name(node) for node in nodes}
    units: dict[str, list[str]] = {node: [] for node in nodes}
    files: dict[str, str] = {}

    def add(node: str, name: str, text: str) -> None:
        files[f"{dirs[node]}/{name}"] = text
        if name not in units[node]:
            units[node].append(name)

    for inst in plan.instances:
        if inst.spans_nodes:
            for node, name, text in systemd_ranks.rank_units(fleet, plan, inst, options):
                add(node, name, text)
        else:
            add(inst.node, unit_name(inst.id), engine_unit(fleet, plan, inst, options))
        prewarm = prewarm_of(fleet, inst.model, options)
        if prewarm is not None:
            for node in [r.node for r in inst.ranks] or [inst.node]:
                add(node, prewarm.unit, prewarm_unit(fleet, plan, inst.model, options))
    gateway_node = nodes[0]
    add(gateway_node, "inferplane-gateway.service",
        gateway_unit(fleet, plan, gateway_node, options))
    files[f"{dirs[gateway_node]}/fleet.yaml"] = fleet_text
    for node in nodes:
        files[f"{dirs[node]}/{TARGET}"] = "\n".join([
            HEADER.rstrip("\n"),
            "[Unit]",
            f"Description=inferplane fleet on {node}",
            f"Wants={' '.join(sorted(units[node]))}",
            "",
            "[Install]",
            "WantedBy=multi-user.target",
            "",
        ])
    if multinode.spanning(plan):
        files["README.md"] = systemd_ranks.index(fleet, plan, units, dirs, gateway_node)
    return files


def check_units(root: Path) -> list[CheckProblem]:
    """Own checks on every unit, then `systemd-analyze verify` where it exists."""
    problems: list[CheckProblem] = []
    for path in sorted(root.rglob("*.service")):
        rel = str(path.relative_to(root))
        text = path.read_text(encoding="utf-8")
        # A oneshot (the weights pre-warm copy) runs once: no Restart=always there.
        required = (("ExecStart=", "RemainAfterExit=yes", "TimeoutStartSec=")
                    if "\nType=oneshot" in text else
                    ("ExecStart=", "Restart=always", "LimitNOFILE=", "TimeoutStopSec="))
        for key in required:
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
