"""`engine: vllm` fleets on this host: plan -> instances, GPU pinning and checks per start.

    plan = plan_for_host(fleet, plan=None, nvml=None)          # or a --plan file, checked
    node = local_node(fleet, plan, None)                       # single-node, else --node
    instances = plan_vllm_instances(plan, node=node, vllm_binary=None)
    preflight_host(instances, nvml=None)   # refuses before anything starts (P19, P22)
    # the supervisor calls GpuPinning(nvml)(instance) before every start (and restart)

Every instance is its own `vllm serve` process (P23) with the plan's argv and env;
`CUDA_VISIBLE_DEVICES` is always set explicitly, to NVML indices resolved from the plan's
GPU UUIDs when it has them (P20, P21), with `CUDA_DEVICE_ORDER=PCI_BUS_ID`.

Startup deadline (P24, P35): vLLM is not ready before it has read the weights, so the
time it may take to become ready grows with their size and the disk's bandwidth:

    deadline_s = max(floor_s, base_s + safety × weights_bytes / disk_bandwidth)

with `base_s` = 120 s (CUDA init, profiling, torch.compile, CUDA-graph capture),
`safety` = 1.5, `floor_s` = 180 s and a default bandwidth of 100 MiB/s (network storage,
P35; give `--disk-bandwidth-mib-s` for a local NVMe). A 35 GB MoE model gets ~620 s.
"""

from __future__ import annotations

import os
import shlex
import socket
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from pydantic import ValidationError

from inferplane.engines import engine_for
from inferplane.errors import InferplaneError
from inferplane.gpus.discovery import (
    DiscoveredGpu,
    check_free_memory,
    discover_gpus,
    resolve_visible_devices,
)
from inferplane.gpus.nvml import NvmlApi
from inferplane.planner.build import DISCOVERED_NODE
from inferplane.planner.plan import Plan, PlanInstance
from inferplane.runtime.instances import ENGINE_HOST, Instance
from inferplane.runtime.vllm_launch import preflight_gpus
from inferplane.spec import FleetSpec

VLLM_BINARY_ENV = "INFERPLANE_VLLM_BINARY"
DEFAULT_DISK_BANDWIDTH_MIB_S = 100.0
STARTUP_BASE_S = 120.0
STARTUP_LOAD_SAFETY = 1.5
STARTUP_FLOOR_S = 180.0
DEFAULT_MAX_PARALLEL_STARTS = 4


def startup_deadline_s(
    weights_bytes: int,
    disk_bandwidth_mib_s: float = DEFAULT_DISK_BANDWIDTH_MIB_S,
    *,
    base_s: float = STARTUP_BASE_S,
    safety: float = STARTUP_LOAD_SAFETY,
    floor_s: float = STARTUP_FLOOR_S,
) -> float:
    """How long an instance with `weights_bytes` of weights may take to become ready."""
    if disk_bandwidth_mib_s <= 0:
        raise InferplaneError(
            "must be positive", field="--disk-bandwidth-mib-s", value=disk_bandwidth_mib_s,
            fix="give the read bandwidth of the disk holding the weights, e.g. 100 (NFS) "
            "or 2000 (local NVMe)",
        )
    load_s = weights_bytes / (disk_bandwidth_mib_s * 2**20)
    return max(floor_s, base_s + safety * load_s)


def vllm_command(binary: str | None) -> list[str]:
    """The command that replaces the plan's `vllm`: `binary` (split like a shell would),
    else $INFERPLANE_VLLM_BINARY, else `vllm`."""
    chosen = binary if binary is not None else os.environ.get(VLLM_BINARY_ENV, "")
    words = shlex.split(chosen) if chosen.strip() else ["vllm"]
    return words


def load_plan(path: Path) -> Plan:
    """A plan written by `inferplane plan --out`."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InferplaneError(
            f"cannot read the plan: {exc.strerror}", field="--plan", value=str(path),
            fix="write one with `inferplane plan FLEET.yaml --out plan.json`",
        ) from exc
    try:
        return Plan.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InferplaneError(
            f"not a valid plan: {where}: {first['msg']}", field="--plan", value=str(path),
            fix="write it again with `inferplane plan FLEET.yaml --out plan.json` of this "
            "inferplane version",
        ) from exc


def check_plan_matches(plan: Plan, fleet: FleetSpec) -> None:
    """Refuse a plan made for another fleet (models, replicas, served names, engine)."""
    problems: list[str] = []
    if plan.engine != fleet.engine.kind:
        problems.append(f"the plan is for engine {plan.engine}, the fleet uses "
                        f"{fleet.engine.kind}")
    wanted = {m.name: m for m in fleet.placed_models}
    planned = {inst.model for inst in plan.instances}
    for name in sorted(planned - set(wanted)):
        problems.append(f"the plan places {name!r}, which the fleet does not have")
    for name, model in wanted.items():
        have = plan.instances_of(name)
        if len(have) != model.replicas:
            problems.append(f"{name!r} has {model.replicas} replica(s) in the fleet but "
                            f"{len(have)} in the plan")
        served = {inst.served_model_name for inst in have}
        if have and served != {model.engine_model_name}:
            problems.append(f"{name!r} is served as {model.engine_model_name!r} but the plan "
                            f"says {sorted(served)}")
    if problems:
        raise InferplaneError(
            "the plan does not match the fleet: " + "; ".join(problems), field="--plan",
            value=plan.fleet_file or None,
            fix="plan this fleet again: `inferplane plan FLEET.yaml --out plan.json`",
        )


def plan_for_host(
    fleet: FleetSpec,
    *,
    plan: Plan | None,
    nvml: NvmlApi | None,
    fleet_file: str = "",
    time_limit_s: float = 5.0,
) -> Plan:
    """The given plan after checking it against the fleet, or a fresh one (`gpus:
    discover` reads this host's GPUs through NVML)."""
    if plan is not None:
        check_plan_matches(plan, fleet)
        return plan
    from inferplane.planner import plan_fleet

    discovered: list[DiscoveredGpu] | None = discover_gpus(nvml) if fleet.discover_gpus else None
    return plan_fleet(fleet, discovered=discovered, fleet_file=fleet_file,
                      time_limit_s=time_limit_s)


def local_node(fleet: FleetSpec, plan: Plan, node: str | None) -> str:
    """The inventory node that is this host: `node`, or the only node there is."""
    known = [DISCOVERED_NODE] if fleet.gpus is None else [n.name for n in fleet.gpus.nodes]
    known += sorted({i.node for i in plan.instances} - set(known))
    if node is not None:
        if node not in known:
            raise InferplaneError(
                "no such node in the fleet's inventory", field="--node", value=node,
                fix=f"use one of {', '.join(known)}",
            )
        return node
    if len(known) == 1:
        return known[0]
    raise InferplaneError(
        f"the fleet spans nodes {', '.join(known)}; `up` runs the instances of one of them",
        field="--node", fix="pass --node NAME for the node this host is",
    )


def plan_vllm_instances(
    plan: Plan,
    *,
    node: str,
    vllm_binary: str | None = None,
    disk_bandwidth_mib_s: float = DEFAULT_DISK_BANDWIDTH_MIB_S,
    host: str = ENGINE_HOST,
) -> list[Instance]:
    """The plan's instances on `node`, each a process with the plan's argv and env.

    `vllm` is replaced by `vllm_command(vllm_binary)`; engines listen on `host`
    (127.0.0.1: only the gateway talks to them) unless the plan's argv says `--host`.
    `start_after` keeps only instances on this node. A plan with replicas that span nodes
    is refused: `up` runs one host (see `refuse_spanning_replicas`)."""
    refuse_spanning_replicas(plan)
    mine = [inst for inst in plan.instances if inst.node == node]
    local = {inst.id for inst in mine}
    command = vllm_command(vllm_binary)
    return [
        _instance(inst, command, local, disk_bandwidth_mib_s, host) for inst in mine
    ]


def refuse_spanning_replicas(plan: Plan) -> None:
    """`inferplane up` supervises processes on one host; a replica whose pipeline stages
    run on several nodes needs every node started together, which the deploy targets do."""
    spanning = [inst for inst in plan.instances if inst.spans_nodes]
    if not spanning:
        return
    models = sorted({inst.model for inst in spanning})
    first = spanning[0]
    nodes = ", ".join(rank.node for rank in first.ranks) or first.node
    raise InferplaneError(
        f"{', '.join(models)} {'spans' if len(models) == 1 else 'span'} several nodes "
        f"(pipeline_parallel_size {first.pipeline_parallel_size}: {first.id} runs on "
        f"{nodes}); `inferplane up` runs the engines of one host",
        field=f"models.{models[0]}.pipeline_parallel_size",
        value=first.pipeline_parallel_size,
        fix="deploy the fleet with `inferplane render FLEET.yaml --target k8s` (or "
        "--target systemd), or set pipeline_parallel_size: 1 on a node large enough to "
        "hold a replica",
    )


def _instance(
    inst: PlanInstance, command: list[str], local: set[str], bandwidth: float, host: str
) -> Instance:
    launch = engine_for("vllm").planned(inst.argv)
    if launch.flag("host") is None:
        launch = launch.with_host(host, add=True)
    argv = launch.with_command(command).argv
    env = dict(inst.env)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in inst.gpu_indices)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return Instance(
        name=inst.id,
        model=inst.model,
        served_name=inst.served_model_name,
        replica=inst.replica,
        port=inst.port,
        engine="vllm",
        argv=tuple(argv),
        env=env,
        host=host,
        gpu_indices=tuple(inst.gpu_indices),
        gpu_uuids=tuple(inst.gpu_uuids or ()),
        gpu_memory_utilization=inst.gpu_memory_utilization,
        start_after=tuple(d for d in inst.start_after if d in local),
        startup_deadline_s=startup_deadline_s(inst.weights_bytes, bandwidth),
    )


def _host_gpus(nvml: NvmlApi | None) -> list[DiscoveredGpu]:
    try:
        return discover_gpus(nvml)
    except InferplaneError as exc:
        raise InferplaneError(
            "starting vLLM instances reads this host's GPUs through NVML (UUID -> index, "
            f"free memory; P19-P22), which failed: {exc.message}", field="gpus",
            fix="run `inferplane up` on the GPU host itself (nvidia-smi must work); to try "
            "the fleet without GPUs, run it with `engine: sim`",
        ) from exc


def _gpu_ids(inst: Instance) -> list[str]:
    return list(inst.gpu_uuids) if inst.gpu_uuids else [str(i) for i in inst.gpu_indices]


class GpuPinning:
    """Run by the supervisor right before each start of a GPU instance: reads the GPUs
    through NVML, resolves the plan's UUIDs to today's indices (P20), refuses when the
    target GPUs lack the instance's share free, naming who holds it (P19, P22), and
    returns the instance with `CUDA_VISIBLE_DEVICES` set to those indices (P21)."""

    def __init__(self, nvml: NvmlApi | None = None) -> None:
        self.nvml = nvml

    def __call__(self, inst: Instance) -> Instance:
        if not inst.gpu_indices and not inst.gpu_uuids:
            return inst
        gpus = _host_gpus(self.nvml)
        indices = resolve_visible_devices(_gpu_ids(inst), gpus)
        preflight_gpus(indices, gpus, inst.gpu_memory_utilization)
        env = {
            **inst.env,
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in indices),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        }
        return replace(inst, env=env, gpu_indices=tuple(indices))


def preflight_host(instances: list[Instance], nvml: NvmlApi | None = None) -> None:
    """Before anything starts: every planned GPU exists here and has free the sum of the
    shares of the instances placed on it (P19, P22); the error names the holders."""
    pinned = [inst for inst in instances if inst.gpu_indices or inst.gpu_uuids]
    if not pinned:
        return
    gpus = _host_gpus(nvml)
    by_index = {gpu.index: gpu for gpu in gpus}
    shares: dict[int, float] = defaultdict(float)
    for inst in pinned:
        for index in resolve_visible_devices(_gpu_ids(inst), gpus):
            shares[index] += inst.gpu_memory_utilization
    for index, share in sorted(shares.items()):
        gpu = by_index[index]
        check_free_memory(gpu, int(gpu.total_bytes * share))


def check_ports_free(instances: list[Instance]) -> None:
    """The plan's fixed engine ports must be free on this host."""
    for inst in instances:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((inst.host, inst.port))
            except OSError as exc:
                raise InferplaneError(
                    f"{inst.name} is planned on port {inst.port}, which is in use here "
                    f"({exc.strerror})", field="port", value=inst.port,
                    fix="stop what listens there, or plan again so the instance gets "
                    "another port",
                ) from exc
