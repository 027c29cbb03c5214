"""Gang scheduling for multi-GPU workloads (P15): Kueue or Volcano, off by default.

A Deployment's replica is one pod (its TP group on one node), so the all-or-nothing unit
is that pod's GPUs. Kueue: the Deployment carries `kueue.x-k8s.io/queue-name` (Kueue's
Deployment integration admits each pod as its own Workload; pod-group labels are for
groups of plain pods and would merge every replica into one group). Volcano: pods use
`schedulerName: volcano` and join a PodGroup (`scheduling.k8s.io/group-name`) whose
`minMember` is the pods per replica and `minResources` one replica's requests, so the
8 GPUs of a DeepSeek-R1 replica are bound together or not at all.

A LeaderWorkerSet's replica is a group of `size` pods on as many nodes; every LWS is
ganged. Kueue: the same label on the LeaderWorkerSet (Kueue's LWS integration admits each
group as one Workload). Volcano: pods use `schedulerName: volcano`, the LWS carries the
queue annotation, and the LWS controller (>= v0.7.0, `gangSchedulingManagement.
schedulerProvider: volcano`) creates one PodGroup per group with `minMember` = `size` and
names it on the pods. No static PodGroup: one template serves every group, so a rendered
group name would put all replicas into one gang.
"""

from __future__ import annotations

from typing import Any

from inferplane.deploy.k8s.context import K8sContext, Workload

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
VOLCANO_SCHEDULER = "volcano"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"  # read by the LWS controller
PODS_PER_REPLICA = 1  # a Deployment replica is one pod (LWS groups: see the module doc)


def ganged(ctx: K8sContext, workload: Workload) -> bool:
    return ctx.options.gang != "none" and (workload.gpus > 1 or workload.size > 1)


def deployment_labels(ctx: K8sContext, workload: Workload) -> dict[str, str]:
    if ganged(ctx, workload) and ctx.options.gang == "kueue":
        return {KUEUE_QUEUE_LABEL: ctx.options.gang_queue}
    return {}


def pod_annotations(ctx: K8sContext, workload: Workload) -> dict[str, str]:
    if ganged(ctx, workload) and ctx.options.gang == "volcano" and not workload.spans_nodes:
        return {VOLCANO_GROUP_ANNOTATION: workload.name}
    return {}


def lws_annotations(ctx: K8sContext, workload: Workload) -> dict[str, str]:
    """The Volcano queue of the PodGroups the LWS controller creates for each group."""
    if ganged(ctx, workload) and ctx.options.gang == "volcano":
        return {VOLCANO_QUEUE_ANNOTATION: ctx.options.gang_queue}
    return {}


def static_pod_group(ctx: K8sContext, workload: Workload) -> bool:
    """A PodGroup file is rendered for ganged Deployments only (see the module doc)."""
    return scheduler_name(ctx, workload) == VOLCANO_SCHEDULER and not workload.spans_nodes


def scheduler_name(ctx: K8sContext, workload: Workload) -> str | None:
    if ganged(ctx, workload) and ctx.options.gang == "volcano":
        return VOLCANO_SCHEDULER
    return None


def _sum_quantities(values: list[str], unit: str) -> str:
    return f"{sum(int(v.removesuffix(unit)) for v in values)}{unit}"


def pod_group(ctx: K8sContext, workload: Workload, pod: dict[str, Any]) -> dict[str, Any]:
    """The Volcano PodGroup of one workload, sized from its rendered pod spec."""
    requests = [c["resources"]["requests"] for c in pod["containers"]]
    gpus = sum(int(r.get("nvidia.com/gpu", "0")) for r in requests)
    min_resources = {
        "cpu": str(sum(int(r["cpu"]) for r in requests) * PODS_PER_REPLICA),
        "memory": _sum_quantities([r["memory"] for r in requests] * PODS_PER_REPLICA, "Gi"),
        "nvidia.com/gpu": str(gpus * PODS_PER_REPLICA),
    }
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": ctx.metadata(workload.name, "engine"),
        "spec": {
            "minMember": PODS_PER_REPLICA,
            "minResources": min_resources,
            "queue": ctx.options.gang_queue,
        },
    }


__all__ = ["KUEUE_QUEUE_LABEL", "VOLCANO_GROUP_ANNOTATION", "VOLCANO_QUEUE_ANNOTATION",
           "deployment_labels", "ganged", "lws_annotations", "pod_annotations", "pod_group",
           "scheduler_name", "static_pod_group"]
