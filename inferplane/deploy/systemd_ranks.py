"""systemd for replicas that span nodes: one unit per rank, each in its node's directory.

`inferplane-<instance>-rank<R>.service` on the rank's node. The plan's leader-address token
becomes the leader node's host (its inventory `address` when the spec has one, else its
name). Rank 0 serves HTTP (the gateway routes to it) and drains like any engine; a worker's
`ExecStop` holds its pipeline stage while the leader's port still answers (at most preStop +
drain), so a host shutdown does not cut the leader's in-flight requests, and lets go at once
when the worker itself died (no `$MAINPID`). `README.md` lists which units go to which host.
"""

from __future__ import annotations

from inferplane.deploy import hosts, multinode
from inferplane.deploy.options import RenderOptions, supports_shutdown_timeout
from inferplane.deploy.systemd_syntax import HEADER, unit_name
from inferplane.engines import engine_for
from inferplane.planner.plan import Plan, PlanInstance
from inferplane.spec import FleetSpec


def rank_unit_name(inst: PlanInstance, rank: int) -> str:
    return unit_name(f"{inst.id}-rank{rank}")


def worker_stop(leader_host: str, port: int, options: RenderOptions) -> str:
    limit = options.prestop_sleep_s + options.drain_s
    return (f'[ -n "$MAINPID" ] || exit 0; i=0; while [ "$i" -lt {limit} ] && curl -s -o '
            f"/dev/null --max-time 2 http://{leader_host}:{port}/health; do sleep 5; "
            "i=$((i + 5)); done")


def rank_units(fleet: FleetSpec, plan: Plan, inst: PlanInstance,
               options: RenderOptions) -> list[tuple[str, str, str]]:
    """(node, unit name, unit text) for every rank of one replica, leader first."""
    from inferplane.deploy.systemd import UnitBody, unit_text

    ranks = multinode.ranks_of(inst)
    leader = hosts.host_of(fleet, ranks[0].node)
    engine = fleet.engine
    out: list[tuple[str, str, str]] = []
    for rank in ranks:
        argv = [multinode.substitute(a, leader) for a in rank.argv]
        launch = engine_for(engine.kind).planned(argv)
        if rank.rank == 0 and launch.is_direct():
            launch = launch.with_host("0.0.0.0")  # the gateway reaches it
            if supports_shutdown_timeout(engine.kind, engine.version):
                launch = launch.with_drain_timeout(options.drain_s)
            argv = list(launch.argv)
        role = (f"leader, port {inst.port}" if rank.rank == 0
                else f"worker of {leader}:{inst.port}")
        deps = [d for d in inst.start_after if rank.rank == 0 and any(
            i.id == d and i.node == rank.node for i in plan.instances)]
        body = UnitBody(
            description=f"inferplane {inst.model} replica {inst.replica} rank {rank.rank} of "
                        f"{len(ranks)} ({role}; GPUs "
                        f"{','.join(str(i) for i in rank.gpu_indices)})",
            argv=argv,
            env={k: multinode.substitute(v, leader) for k, v in rank.env.items()},
            gpu_indices=rank.gpu_indices, deps=deps,
            exec_stop=None if rank.rank == 0 else worker_stop(leader, inst.port, options),
        )
        out.append((rank.node, rank_unit_name(inst, rank.rank),
                    unit_text(fleet, plan, options, inst, body)))
    return out


def index(fleet: FleetSpec, plan: Plan, units: dict[str, list[str]], dirs: dict[str, str],
          gateway_node: str) -> str:
    """README.md: which directory goes to which host, and the ranks of each replica."""
    lines = [
        HEADER.rstrip("\n").replace("# ", "<!-- ", 1) + " -->",
        "# inferplane: systemd units by host",
        "",
        "Copy each directory to the host it is named after: its `*.service` and",
        "`inferplane.target` to `/etc/systemd/system/` (and `fleet.yaml`, where present, to",
        "`/etc/inferplane/fleet.yaml`), then `systemctl daemon-reload && systemctl enable",
        "--now inferplane.target` on that host. The gateway runs on "
        f"`{gateway_node}`.",
        "",
        "| directory | host | units |",
        "|---|---|---|",
    ]
    for node, names in sorted(units.items(), key=lambda item: dirs[item[0]]):
        lines.append(f"| `{dirs[node]}/` | {hosts.host_of(fleet, node)} | "
                     f"{', '.join(f'`{n}`' for n in sorted(names))} |")
    lines += [
        "",
        "## Replicas that span nodes",
        "",
        "Each rank is one unit on its own host; rank 0 (the leader) serves HTTP and the gateway",
        "routes to it. Start every rank of a replica: the leader waits for its workers before",
        "it serves, and all ranks restart on their own (`Restart=always`) until they meet.",
        "",
        "| replica | rank | host | unit |",
        "|---|---|---|---|",
    ]
    for inst in multinode.spanning(plan):
        for rank in inst.ranks:
            lines.append(f"| {inst.id} | {rank.rank}{' (leader)' if rank.rank == 0 else ''} | "
                         f"{hosts.host_of(fleet, rank.node)} | "
                         f"`{dirs[rank.node]}/{rank_unit_name(inst, rank.rank)}` |")
    return "\n".join(lines) + "\n"


__all__ = ["index", "rank_unit_name", "rank_units", "worker_stop"]
