"""One ClusterIP Service per model: selects every pod serving it, co-located or not; for a
model whose replicas span nodes, the LeaderWorkerSet's leaders (the workers serve no HTTP)."""

from __future__ import annotations

from typing import Any

from inferplane.deploy.k8s.context import ENGINE_SERVICE_PORT, K8sContext
from inferplane.deploy.k8s.leaderworkerset import leader_selector
from inferplane.deploy.names import model_label, object_name, port_name


def service_name(model: str) -> str:
    return object_name(model)


def service(ctx: K8sContext, model: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": ctx.metadata(service_name(model), "engine", **{model_label(model): "true"}),
        "spec": {
            "type": "ClusterIP",
            "selector": model_selector(ctx, model),
            "ports": [{"name": "http", "port": ENGINE_SERVICE_PORT,
                       "targetPort": port_name(model), "protocol": "TCP"}],
        },
    }


def model_selector(ctx: K8sContext, model: str) -> dict[str, str]:
    selector = {model_label(model): "true"}
    if ctx.spans_nodes(model):
        selector.update(leader_selector())
    return selector
