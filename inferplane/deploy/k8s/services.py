"""One ClusterIP Service per model: selects every pod serving it, co-located or not."""

from __future__ import annotations

from typing import Any

from inferplane.deploy.k8s.context import ENGINE_SERVICE_PORT, K8sContext
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
            "selector": {model_label(model): "true"},
            "ports": [{"name": "http", "port": ENGINE_SERVICE_PORT,
                       "targetPort": port_name(model), "protocol": "TCP"}],
        },
    }


def service_url(ctx: K8sContext, model: str) -> str:
    return f"http://{service_name(model)}.{ctx.namespace}.svc:{ENGINE_SERVICE_PORT}"
