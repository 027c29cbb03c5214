"""Deployments: one per model, or one per co-located set of models (S0)."""

from __future__ import annotations

from typing import Any

from inferplane.deploy.k8s import gang, weights
from inferplane.deploy.k8s.context import K8sContext, Workload
from inferplane.deploy.k8s.engine import pod_spec, startup_budget_s
from inferplane.deploy.names import ANNOTATION_INSTANCES, port_name


def autoscaled(ctx: K8sContext, workload: Workload) -> bool:
    """A single-model workload with scaling bounds; its replica count belongs to KEDA/HPA."""
    return (
        ctx.options.autoscaler != "none"
        and not workload.colocated
        and workload.models[0] in ctx.fleet.scaling.models
    )


def deployment(ctx: K8sContext, workload: Workload) -> dict[str, Any]:
    # A pre-warmed pod waits for the node's copy first (P35), then loads (P24).
    prewarmed = weights.prewarmed_models(ctx)
    copy_s = sum(ctx.options.copy_budget_s(weights.weights_bytes(ctx, m))
                 for m in workload.models if m in prewarmed)
    spec: dict[str, Any] = {
        "selector": {"matchLabels": ctx.selector(workload)},
        # The new pod needs the GPU the old one holds: stop one, then start one (P26).
        "strategy": {"type": "RollingUpdate",
                     "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
        "revisionHistoryLimit": 5,
        "progressDeadlineSeconds": max(
            600, 2 * (copy_s + max(startup_budget_s(ctx, m) for m in workload.members))
        ),
        "template": {
            "metadata": {
                "labels": ctx.pod_labels(workload),
                "annotations": {
                    ANNOTATION_INSTANCES: ",".join(m.id for m in workload.members),
                    "kubectl.kubernetes.io/default-container": default_container(workload),
                    **gang.pod_annotations(ctx, workload),
                },
            },
            "spec": pod_spec(ctx, workload),
        },
    }
    if not autoscaled(ctx, workload):
        spec["replicas"] = workload.replicas
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": ctx.metadata(workload.name, "engine",
                                 **gang.deployment_labels(ctx, workload)),
        "spec": spec,
    }


def default_container(workload: Workload) -> str:
    """`kubectl logs` without -c shows the last-started (usually the largest) model."""
    return port_name(workload.members[-1].model)
