"""Engine pods: containers, probes, drain, GPU resources, /dev/shm, nofile, co-location.

A workload's pod runs one engine container per member. A co-located pod (S0, P18–P20):
only the first container requests `nvidia.com/gpu`; it writes the UUIDs of the GPUs the
device plugin gave it to an emptyDir. The others request no GPU, see every card through
`NVIDIA_VISIBLE_DEVICES=all`, wait for that file and for the containers they start after,
map each UUID to its NVML index and exec vLLM with that `CUDA_VISIBLE_DEVICES` (integer
indices: vLLM rejects UUIDs, P20). On nodes whose GPUs are MIG-partitioned or shared
through HAMi (the fleet file's `gpus.nodes[].sharing`), each container requests its own
slice instead and no hand-off is needed (see `sharing`).
"""

from __future__ import annotations

import shlex
from typing import Any

from inferplane.deploy.k8s import gang, sharing, weights
from inferplane.deploy.k8s.context import K8sContext, Workload
from inferplane.deploy.k8s.weights import HF_CACHE_HOST, HF_CACHE_MOUNT
from inferplane.deploy.names import port_name
from inferplane.deploy.options import supports_shutdown_timeout
from inferplane.engines import engine_for
from inferplane.planner.plan import PlanInstance

GPU_RESOURCE = "nvidia.com/gpu"
HANDOFF_DIR = "/run/inferplane/gpu"
HANDOFF_FILE = f"{HANDOFF_DIR}/uuids"
HANDOFF_WAIT_S = 600


def shm_gib(tensor_parallel_size: int) -> int:
    """/dev/shm for NCCL and vLLM's shared-memory broadcast: grows with the TP group."""
    return 2 if tensor_parallel_size == 1 else min(64, 8 * tensor_parallel_size)


def engine_argv(ctx: K8sContext, inst: PlanInstance) -> list[str]:
    """The plan's exact argv, listening on every interface and draining on SIGTERM (P27)."""
    engine = ctx.fleet.engine
    launch = engine_for(engine.kind).planned(inst.argv).with_host("0.0.0.0")
    if supports_shutdown_timeout(engine.kind, engine.version):
        launch = launch.with_drain_timeout(ctx.options.drain_s)
    return list(launch.argv)


def launcher_script(
    ctx: K8sContext, inst: PlanInstance, role: str, wait_ports: list[int], cpu: bool = False
) -> str:
    """The `sh -c` wrapper that execs the argv given as "$@" (no re-quoting of JSON, P05)."""
    nofile = ctx.options.nofile
    lines = [
        "set -eu",
        f'ulimit -n {nofile} 2>/dev/null || ulimit -n "$(ulimit -Hn)"',  # P30
    ]
    if cpu:
        from inferplane.engines.vllm.cpu import K8S_BIND_LINE

        lines.append(K8S_BIND_LINE)
    if role == "primary":
        lines += [
            f"nvidia-smi --query-gpu=gpu_uuid --format=csv,noheader > {HANDOFF_FILE}.tmp",
            f"mv {HANDOFF_FILE}.tmp {HANDOFF_FILE}",
        ]
    if role == "secondary":
        lines += [
            "i=0",
            f'until [ -s {HANDOFF_FILE} ]; do i=$((i + 1)); if [ "$i" -gt {HANDOFF_WAIT_S} ]; '
            f'then echo "no GPU UUID in {HANDOFF_FILE}" >&2; exit 1; fi; sleep 1; done',
            'idx=""',
            f"for uuid in $(cat {HANDOFF_FILE}); do",
            "  n=$(nvidia-smi --query-gpu=index,gpu_uuid --format=csv,noheader"
            " | awk -F', *' -v u=\"$uuid\" '$2 == u {print $1}')",
            '  if [ -z "$n" ]; then echo "GPU $uuid is not visible" >&2; exit 1; fi',
            '  idx="${idx:+$idx,}$n"',
            "done",
            'export CUDA_VISIBLE_DEVICES="$idx"',
            'echo "CUDA_VISIBLE_DEVICES=$idx (from $(tr "\\n" " " < ' + HANDOFF_FILE + '))"',
        ]
    for port in wait_ports:
        probe = (
            "import urllib.request; "
            f"urllib.request.urlopen('http://127.0.0.1:{port}/health', timeout=2)"
        )
        lines.append(
            f"until python3 -c {shlex.quote(probe)} 2>/dev/null; do sleep 5; done"
        )
    lines.append('exec "$@"')
    return "\n".join(lines) + "\n"


def _probe(path: str, port: str, period: int, failures: int, timeout: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": timeout,
    }


def startup_budget_s(ctx: K8sContext, inst: PlanInstance) -> int:
    """P24; pre-warmed weights (P35) are read from local disk."""
    local = ctx.options.weights == "prewarm" and inst.model in weights.prewarmed_models(ctx)
    return ctx.options.startup_budget_s(inst.weights_bytes, local=local)


def engine_container(
    ctx: K8sContext,
    workload: Workload,
    position: int,
) -> dict[str, Any]:
    inst = workload.members[position]
    opts = ctx.options
    cpu = bool(inst.cpu_cores)  # a CPU engine: cores and RAM, no GPU, no hand-off
    paths = engine_for(ctx.fleet.engine.kind, ctx.fleet.engine.device).endpoints
    gpu_slices = None if cpu else sharing.slices(ctx, workload)
    handoff = workload.colocated and gpu_slices is None and not cpu
    role = "solo" if not handoff else "primary" if position == 0 else "secondary"
    earlier = workload.members[:position]
    wait_ports = [m.port for m in earlier if m.id in inst.start_after]
    # The startup budget covers waiting for the containers this one starts after (S0 P24).
    budget = startup_budget_s(ctx, inst) + sum(
        startup_budget_s(ctx, m) for m in earlier if m.id in inst.start_after
    )
    if role == "secondary":
        budget += HANDOFF_WAIT_S if not wait_ports else 0
    pname = port_name(inst.model)
    env = {k: v for k, v in inst.env.items() if k != "CUDA_VISIBLE_DEVICES"}
    if role != "solo":
        env["NVIDIA_DRIVER_CAPABILITIES"] = "compute,utility"  # nvidia-smi for the hand-off
    if role == "secondary":
        env["NVIDIA_VISIBLE_DEVICES"] = "all"
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA numbers GPUs as nvidia-smi does
    model = ctx.fleet.model(inst.model)
    if model is not None and model.source and not model.source.startswith("/"):
        env.setdefault("HF_HOME", HF_CACHE_MOUNT)
    requests: dict[str, str] = {
        "cpu": str(2 + 2 * inst.tensor_parallel_size),
        "memory": f"{16 + shm_gib(inst.tensor_parallel_size)}Gi",
    }
    limits: dict[str, str] = {}
    argv = engine_argv(ctx, inst)
    if cpu:
        from inferplane.engines.vllm import cpu as vllm_cpu

        requests = vllm_cpu.k8s_resources(inst.cpu_cores, inst.host_memory_bytes)
        limits = dict(requests)  # Guaranteed QoS: the static CPU manager gives whole cores
        env.pop(vllm_cpu.THREADS_BIND_ENV, None)  # the pod's own cpuset, read at start
    elif gpu_slices is not None:
        piece = gpu_slices[position]
        requests.update(piece.resources)
        limits.update(piece.resources)  # requests = limits
        argv = sharing.with_utilization(ctx.fleet.engine.kind, argv,
                                        piece.gpu_memory_utilization)
    elif role in ("solo", "primary"):
        requests[GPU_RESOURCE] = str(inst.tensor_parallel_size)
        limits[GPU_RESOURCE] = str(inst.tensor_parallel_size)  # requests = limits
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if role != "solo":
        mounts.append({"name": "gpu-handoff", "mountPath": HANDOFF_DIR})
    weights_mount = weights.engine_mount(ctx, inst.model)
    if weights_mount is not None:
        mounts.append(weights_mount.mount)
        env.update(weights_mount.env)
    elif weights.uses_hf_cache(ctx, inst.model):
        mounts.append({"name": "hf-cache", "mountPath": HF_CACHE_MOUNT})
    adapters = weights.adapter_mounts(ctx, inst.model)
    mounts += [a.mount for a in adapters]
    moved = {a.host_path: a.container_path for a in adapters if a.host_path != a.container_path}
    if moved:
        argv = list(engine_for(ctx.fleet.engine.kind).planned(argv).with_lora_paths(moved).argv)
    container: dict[str, Any] = {
        "name": pname,
        "image": ctx.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", launcher_script(ctx, inst, role, wait_ports, cpu=cpu),
                    "launch"],
        "args": argv,
        "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
        "ports": [{"name": pname, "containerPort": inst.port, "protocol": "TCP"}],
        "resources": {"requests": requests, **({"limits": limits} if limits else {})},
        "volumeMounts": mounts,
        "startupProbe": _probe(
            paths.models, pname, opts.probe_period_s, budget // opts.probe_period_s, 5
        ),
        "readinessProbe": _probe(paths.models, pname, opts.probe_period_s, 3, 5),
        "livenessProbe": _probe(paths.health, pname, 30, 3, 10),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(opts.prestop_sleep_s)]}}},
    }
    return container


def pod_spec(ctx: K8sContext, workload: Workload) -> dict[str, Any]:
    inst = workload.members[0]
    tp = max(m.tensor_parallel_size for m in workload.members)
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{shm_gib(tp)}Gi"}}
    ]
    cpu = bool(inst.cpu_cores)
    if workload.colocated and not cpu and sharing.slices(ctx, workload) is None:
        volumes.append({"name": "gpu-handoff", "emptyDir": {"medium": "Memory",
                                                             "sizeLimit": "1Mi"}})
    hf = False
    for member in workload.members:
        weights_mount = weights.engine_mount(ctx, member.model)
        if weights_mount is not None:
            volumes.append(weights_mount.volume)
        elif weights.uses_hf_cache(ctx, member.model) and not hf:
            hf = True
            volumes.append({"name": "hf-cache",
                            "hostPath": {"path": HF_CACHE_HOST, "type": "DirectoryOrCreate"}})
    for model in dict.fromkeys(m.model for m in workload.members):
        volumes += [a.volume for a in weights.adapter_mounts(ctx, model) if a.volume]
    prewarmed = [m for m in workload.models if m in weights.prewarmed_models(ctx)]
    spec: dict[str, Any] = {
        "containers": [engine_container(ctx, workload, i) for i in range(len(workload.members))],
        "enableServiceLinks": False,  # a Service named `vllm` would inject VLLM_PORT
        "nodeSelector": ctx.node_selector(inst.gpu_type),
        "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        "terminationGracePeriodSeconds": ctx.options.grace_s(),
    }
    if cpu:  # any node with the cores and RAM; the fleet's node labels when it gives them
        spec["nodeSelector"] = ctx.cpu_node_selector()
        del spec["tolerations"]
        if not spec["nodeSelector"]:
            del spec["nodeSelector"]
    pin = _node_pin(ctx, workload)
    if pin is not None:  # placement.node, as compose and systemd keep it
        spec["nodeSelector"] = {**spec.get("nodeSelector", {}), HOSTNAME_LABEL: pin}
    if prewarmed:
        spec["initContainers"] = [weights.wait_init_container(ctx, prewarmed)]
        volumes.append(weights.prewarm_root_volume(ctx))
    scheduler = gang.scheduler_name(ctx, workload)
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    spec["volumes"] = sorted(volumes, key=lambda v: str(v["name"]))
    return spec


__all__ = ["engine_argv", "engine_container", "launcher_script", "pod_spec", "shm_gib",
           "startup_budget_s"]


HOSTNAME_LABEL = "kubernetes.io/hostname"


def _node_pin(ctx: K8sContext, workload: Workload) -> str | None:
    """The node a workload's models are pinned to (`placement.node`): the inventory node's
    own `kubernetes.io/hostname` label when the fleet gives one, else its name."""
    pins = {m.placement.node for m in ctx.fleet.models
            if m.name in workload.models and m.placement.node is not None}
    if len(pins) != 1:  # none, or members pinned apart (the planner keeps those apart)
        return None
    (node,) = pins
    inventory = ctx.fleet.gpus
    for n in inventory.nodes if inventory is not None else []:
        if n.name == node:
            return str(dict(n.labels).get(HOSTNAME_LABEL, node))
    return node

