"""LeaderWorkerSets: replicas that span nodes (pipeline parallel across nodes, P13, P15).

One `leaderworkerset.x-k8s.io/v1` LeaderWorkerSet per model: `replicas` groups of `size`
pods (one per node of a replica). The leader (rank 0) serves HTTP and carries the probes
and the drain; workers run headless. Both pod templates come from the Deployment machinery
(`engine.pod_spec`): GPUs requested = limits = TP per pod, nodeSelector on the GPU type,
tolerations, /dev/shm for the TP group, nofile, weights. The plan's leader-address token
becomes `$(LWS_LEADER_ADDRESS)` and a worker's rank `$(LWS_WORKER_INDEX)`: the LWS webhook
puts both variables first in every container's env, so Kubernetes expands them in args and
env values.

What keeps a group alive while it loads (P24): no probes on workers (a liveness failure
there restarts a container, and `RecreateGroupOnPodRestart` recreates the whole group);
the leader's startup budget is the Deployment formula on the whole model's weights (the
ranks read their shares from the same store at once); `startupPolicy: LeaderCreated`
(with LeaderReady the workers would wait for a leader that is ready only once its workers
joined). Rollout: `maxSurge: 0`, one group at a time (P26). Drain (P27): the leader drains
as a Deployment pod does; workers hold their pipeline stage in preStop while the leader's
port still answers, so in-flight requests finish before the stages go.
"""

from __future__ import annotations

import shlex
from typing import Any

from inferplane.deploy import multinode
from inferplane.deploy.k8s import gang, workloads
from inferplane.deploy.k8s.context import K8sContext, Workload
from inferplane.deploy.k8s.engine import engine_argv, pod_spec
from inferplane.deploy.names import ANNOTATION_INSTANCES
from inferplane.errors import InferplaneError
from inferplane.planner.plan import PlanInstance

LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"
WORKER_INDEX = "$(LWS_WORKER_INDEX)"
RESTART_POLICY = "RecreateGroupOnPodRestart"
STARTUP_POLICY = "LeaderCreated"
# Inside a pod the network interface is the CNI's eth0, never the host NIC the plan names.
POD_NIC = "eth0"
SOCKET_IFNAME_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def leader_selector() -> dict[str, str]:
    """Leader pods only (the LWS controller labels them worker-index 0): they serve HTTP."""
    return {LWS_WORKER_INDEX_LABEL: "0"}


def _pod_env(env: dict[str, str]) -> dict[str, str]:
    out = {k: multinode.substitute(v, LEADER_ADDRESS) for k, v in env.items()}
    for key in SOCKET_IFNAME_VARS:  # P34: NCCL/Gloo bootstrap over the pod network
        out[key] = POD_NIC
    return out


def _check_sharing(ctx: K8sContext, inst: PlanInstance) -> None:
    inventory = ctx.fleet.gpus
    if inventory is None:
        return
    for rank in multinode.ranks_of(inst):
        node = inventory.node(rank.node)
        if node is not None and node.sharing == "mig":
            raise InferplaneError(
                f"{inst.id} spans nodes, but its rank {rank.rank} is on {rank.node}, whose "
                "GPUs are MIG slices: a pipeline stage needs whole GPUs",
                field="gpus.nodes.sharing", value=rank.node,
                fix="plan this model on nodes without MIG (sharing: none)",
            )


def _template(ctx: K8sContext, workload: Workload, inst: PlanInstance,
              args: list[str]) -> dict[str, Any]:
    one = Workload(workload.name, (inst,), workload.replicas)
    spec = pod_spec(ctx, one)
    (container,) = spec["containers"]
    container["args"] = args
    return {
        "metadata": {
            "labels": ctx.pod_labels(workload),
            "annotations": {
                ANNOTATION_INSTANCES: inst.id,
                "kubectl.kubernetes.io/default-container": container["name"],
            },
        },
        "spec": spec,
    }


def leader_template(ctx: K8sContext, workload: Workload) -> dict[str, Any]:
    inst = workload.members[0]
    leader = inst.model_copy(update={"env": _pod_env(inst.env)})
    # Listen on every interface and drain on SIGTERM, unless a shell wraps `vllm serve`
    # (the Ray form): that argv is the plan's own.
    args = engine_argv(ctx, leader) if multinode.is_direct_vllm(inst.argv) else list(inst.argv)
    args = [multinode.substitute(a, LEADER_ADDRESS) for a in args]
    return _template(ctx, workload, leader, args)


def worker_prestop(ctx: K8sContext, leader_port: int) -> list[str]:
    """Hold this pipeline stage while the leader's API port still answers (it is draining),
    at most preStop + drain seconds; a dead leader lets the worker go at once."""
    limit = ctx.options.prestop_sleep_s + ctx.options.drain_s
    probe = ("import os, socket; socket.create_connection("
             f'(os.environ["LWS_LEADER_ADDRESS"], {leader_port}), timeout=2).close()')
    script = (f'i=0; while [ "$i" -lt {limit} ] && python3 -c {shlex.quote(probe)} '
              '2>/dev/null; do sleep 5; i=$((i + 5)); done')
    return ["/bin/sh", "-c", script]


def worker_template(ctx: K8sContext, workload: Workload) -> dict[str, Any]:
    inst = workload.members[0]
    ranks = multinode.ranks_of(inst)
    argv = multinode.worker_argv(inst, WORKER_INDEX)
    worker = inst.model_copy(update={
        "argv": argv,
        "env": _pod_env(multinode.worker_env(inst, WORKER_INDEX)),
        "gpu_indices": ranks[1].gpu_indices,
        "gpu_uuids": ranks[1].gpu_uuids,
    })
    template = _template(ctx, workload, worker,
                         [multinode.substitute(a, LEADER_ADDRESS) for a in argv])
    (container,) = template["spec"]["containers"]
    # Headless: no HTTP port, and no probe that could restart a loading group (P24).
    for key in ("ports", "startupProbe", "readinessProbe", "livenessProbe"):
        container.pop(key, None)
    container["lifecycle"] = {"preStop": {"exec": {"command": worker_prestop(ctx, inst.port)}}}
    return template


def leader_worker_set(ctx: K8sContext, workload: Workload) -> dict[str, Any]:
    inst = workload.members[0]
    _check_sharing(ctx, inst)
    spec: dict[str, Any] = {
        # Workers start with the leader: the leader is ready only once they joined.
        "startupPolicy": STARTUP_POLICY,
        # The new group needs the GPUs the old one holds: stop one, then start one (P26).
        "rolloutStrategy": {
            "type": "RollingUpdate",
            "rollingUpdateConfiguration": {"maxSurge": 0, "maxUnavailable": 1},
        },
        "leaderWorkerTemplate": {
            "size": workload.size,
            # A lost stage stalls the pipeline: restart the group together (P15).
            "restartPolicy": RESTART_POLICY,
            "leaderTemplate": leader_template(ctx, workload),
            "workerTemplate": worker_template(ctx, workload),
        },
    }
    if not workloads.autoscaled(ctx, workload):
        spec["replicas"] = workload.replicas
    metadata = ctx.metadata(workload.name, "engine", **gang.deployment_labels(ctx, workload))
    annotations = gang.lws_annotations(ctx, workload)
    if annotations:
        metadata["annotations"] = annotations
    return {
        "apiVersion": workload.api_version,
        "kind": workload.kind,
        "metadata": metadata,
        "spec": spec,
    }


__all__ = ["LEADER_ADDRESS", "LWS_NAME_LABEL", "LWS_WORKER_INDEX_LABEL", "WORKER_INDEX",
           "leader_selector", "leader_template", "leader_worker_set",
           "worker_prestop", "worker_template"]
