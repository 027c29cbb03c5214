"""Gateway API Inference Extension (GIE v1): an InferencePool per model, and its picker.

With `--inference-pool` every model also gets an `InferencePool`
(`inference.networking.k8s.io/v1`): the pods of its Service (same selector) on the
model's container port, so a GIE-capable Gateway (kgateway, Istio, Envoy Gateway, NGINX
Gateway Fabric) can route to it with an HTTPRoute instead of through inferplane's gateway.
The pool names its endpoint picker (EPP) through `endpointPickerRef`: a Service
`<model>-epp` on port 9002 (the EPP's ext-proc gRPC port), failing closed when the
picker does not answer. With `--epp-image IMAGE` the render also runs one picker per pool
(Deployment, Service, and a ServiceAccount/Role/RoleBinding to read the pools and their
pods), started with the flags GIE's endpoint pickers take (`--pool-name`,
`--pool-namespace`, `--grpc-port`, `--grpc-health-port`, as GIE's conformance manifests
run them); without it, install a picker under that Service name yourself
(docs/deploy.md). What this path keeps and loses of inferplane's gateway: docs/deploy.md.
"""

from __future__ import annotations

from typing import Any

from inferplane.deploy.k8s.context import POD_NAMESPACE, K8sContext, pod_namespace_env
from inferplane.deploy.k8s.services import model_selector
from inferplane.deploy.names import LABEL_COMPONENT, LABEL_PART_OF, PART_OF, object_name

API_VERSION = "inference.networking.k8s.io/v1"
KIND = "InferencePool"
EPP_GRPC_PORT = 9002  # ext-proc, what the Gateway calls
EPP_HEALTH_PORT = 9003  # gRPC health, service "inference-extension"
EPP_METRICS_PORT = 9090
EPP_HEALTH_SERVICE = "inference-extension"
EPP_ACCOUNT = "inferplane-epp"
LABEL_POOL = "inferplane.io/inference-pool"


def pool_name(model: str) -> str:
    return object_name(model)


def epp_name(model: str) -> str:
    return object_name(f"{model}-epp")


def model_ports(ctx: K8sContext, model: str) -> list[int]:
    """The container ports the model's pods serve it on (one for every workload, or it
    cannot be one pool: a pool's every port is tried on every pod it selects)."""
    return sorted({inst.port for w in ctx.workload_of(model) for inst in w.members
                   if inst.model == model})


def pooled_models(ctx: K8sContext) -> list[str]:
    return [m for m in ctx.models if len(model_ports(ctx, m)) == 1]


def inference_pool(ctx: K8sContext, model: str) -> dict[str, Any]:
    (port,) = model_ports(ctx, model)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": ctx.metadata(pool_name(model), "inference-pool"),
        "spec": {
            "selector": {"matchLabels": model_selector(ctx, model)},
            "targetPorts": [{"number": port}],
            "endpointPickerRef": {
                "name": epp_name(model),
                "port": {"number": EPP_GRPC_PORT},
                "failureMode": "FailClose",  # no picker, no guessing: the Gateway says 5xx
            },
        },
    }


def _epp_selector(model: str) -> dict[str, str]:
    return {LABEL_PART_OF: PART_OF, LABEL_COMPONENT: "epp", LABEL_POOL: pool_name(model)}


def epp_service(ctx: K8sContext, model: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": ctx.metadata(epp_name(model), "epp"),
        "spec": {
            "type": "ClusterIP",
            "selector": _epp_selector(model),
            "ports": [{"name": "grpc", "port": EPP_GRPC_PORT, "targetPort": "grpc",
                       "protocol": "TCP", "appProtocol": "http2"}],
        },
    }


def epp_deployment(ctx: K8sContext, model: str, image: str) -> dict[str, Any]:
    probe = {"grpc": {"port": EPP_HEALTH_PORT, "service": EPP_HEALTH_SERVICE},
             "initialDelaySeconds": 5, "periodSeconds": 10}
    container = {
        "name": "epp",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "args": ["--pool-name", pool_name(model), "--pool-namespace", POD_NAMESPACE,
                 "--grpc-port", str(EPP_GRPC_PORT),
                 "--grpc-health-port", str(EPP_HEALTH_PORT)],
        "env": [pod_namespace_env()],
        "ports": [{"name": "grpc", "containerPort": EPP_GRPC_PORT, "protocol": "TCP"},
                  {"name": "grpc-health", "containerPort": EPP_HEALTH_PORT, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": EPP_METRICS_PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "500m", "memory": "256Mi"},
                      "limits": {"memory": "1Gi"}},
        "readinessProbe": probe,
        "livenessProbe": probe,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": ctx.metadata(epp_name(model), "epp"),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": _epp_selector(model)},
            "template": {
                "metadata": {"labels": {**ctx.base_labels("epp"), **_epp_selector(model)}},
                "spec": {
                    "serviceAccountName": EPP_ACCOUNT,
                    "containers": [container],
                    "enableServiceLinks": False,
                    # As long as the engines' own grace: requests it picked for may still run.
                    "terminationGracePeriodSeconds": ctx.options.grace_s(),
                },
            },
        },
    }


def epp_rbac(ctx: K8sContext) -> list[dict[str, Any]]:
    """What a picker reads: its InferencePool and the pods the pool selects."""
    rules = [
        {"apiGroups": ["inference.networking.k8s.io"], "resources": ["inferencepools"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    ]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": ctx.metadata(EPP_ACCOUNT, "epp")},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": ctx.metadata(EPP_ACCOUNT, "epp"), "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": ctx.metadata(EPP_ACCOUNT, "epp"),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": EPP_ACCOUNT},
         "subjects": [{"kind": "ServiceAccount", "name": EPP_ACCOUNT,
                       "namespace": ctx.namespace}]},
    ]
