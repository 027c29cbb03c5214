"""The gateway: ConfigMaps (the fleet file, the plan), Deployment (>= 2 replicas), Service,
PDB, an optional Ingress with an explicit body limit (P41) and long timeouts (P40), and the
RBAC its pod discovery needs (it watches the EndpointSlices of every model's Service, so
each pod is a replica of its own, capped by the plan's max_num_seqs: docs/deploy.md)."""

from __future__ import annotations

import hashlib
import math
from typing import Any

from inferplane.deploy.k8s.context import POD_NAMESPACE, K8sContext, pod_namespace_env
from inferplane.deploy.names import LABEL_COMPONENT, LABEL_PART_OF, PART_OF
from inferplane.errors import InferplaneError

GATEWAY_NAME = "inferplane-gateway"
CONFIG_NAME = "inferplane-fleet"
PLAN_CONFIG_NAME = "inferplane-plan"
CONFIG_MOUNT = "/etc/inferplane"
PLAN_FILE = "plan.json"
CONFIGMAP_MAX_BYTES = 1024 * 1024  # the API server's limit on a ConfigMap's data


def _labels(ctx: K8sContext) -> dict[str, str]:
    return ctx.base_labels("gateway")


def _selector() -> dict[str, str]:
    return {LABEL_PART_OF: PART_OF, LABEL_COMPONENT: "gateway"}


def config_map(ctx: K8sContext, fleet_text: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": ctx.metadata(CONFIG_NAME, "gateway"),
        "data": {"fleet.yaml": fleet_text},
    }


def plan_text(ctx: K8sContext) -> str:
    return ctx.plan.model_dump_json(indent=2) + "\n"


def plan_config_map(ctx: K8sContext) -> dict[str, Any]:
    """The plan, for the gateway: each discovered pod's cap is its instance's max_num_seqs
    (matched by the pod's `inferplane.io/instances` annotation, docs/deploy.md)."""
    text = plan_text(ctx)
    if len(text.encode()) > CONFIGMAP_MAX_BYTES:
        raise InferplaneError(
            "the plan is too large for a ConfigMap",
            field="plan", value=f"{len(text.encode())} bytes",
            fix="split the fleet into several fleets (a ConfigMap holds at most 1 MiB)",
        )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": ctx.metadata(PLAN_CONFIG_NAME, "gateway"),
        "data": {PLAN_FILE: text},
    }


def gateway_args(ctx: K8sContext) -> list[str]:
    # No Service URLs: behind one, kube-proxy would spread requests at random and the
    # balancer would see a whole model as one replica (issue 24).
    return ["gateway", "--fleet", f"{CONFIG_MOUNT}/fleet.yaml",
            "--plan", f"{CONFIG_MOUNT}/{PLAN_FILE}", "--host", "0.0.0.0",
            "--port", str(ctx.fleet.gateway.port),
            "--discover", "kubernetes", "--namespace", POD_NAMESPACE]


def rbac(ctx: K8sContext) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding: read EndpointSlices (discovery) and pods (the
    labels a pod's replica carries), in the fleet's namespace only."""
    rules = [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    ]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": ctx.metadata(GATEWAY_NAME, "gateway")},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": ctx.metadata(GATEWAY_NAME, "gateway"), "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": ctx.metadata(GATEWAY_NAME, "gateway"),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": GATEWAY_NAME},
         "subjects": [{"kind": "ServiceAccount", "name": GATEWAY_NAME,
                       "namespace": ctx.namespace}]},
    ]


def deployment(ctx: K8sContext, config_hash: str) -> dict[str, Any]:
    plan_hash = hashlib.sha256(plan_text(ctx).encode()).hexdigest()[:16]
    port = ctx.fleet.gateway.port
    timeouts = ctx.fleet.gateway.timeouts
    # Long streams drain before the pod goes: preStop, then the longest first byte.
    drain_s = ctx.options.prestop_sleep_s + math.ceil(min(timeouts.total_s, 3600))
    container = {
        "name": "gateway",
        "image": ctx.options.gateway_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["inferplane"],
        "args": gateway_args(ctx),
        "env": [pod_namespace_env()],
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "1", "memory": "512Mi"},
                      "limits": {"memory": "2Gi"}},
        "volumeMounts": [{"name": "fleet", "mountPath": CONFIG_MOUNT, "readOnly": True}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"},
                           "periodSeconds": 5, "failureThreshold": 2, "timeoutSeconds": 3},
        "livenessProbe": {"httpGet": {"path": "/health", "port": "http"},
                          "periodSeconds": 15, "failureThreshold": 4, "timeoutSeconds": 5},
        "lifecycle": {"preStop": {"exec": {"command": ["sleep",
                                                      str(ctx.options.prestop_sleep_s)]}}},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": ctx.metadata(GATEWAY_NAME, "gateway"),
        "spec": {
            "replicas": ctx.options.gateway_replicas,
            "selector": {"matchLabels": _selector()},
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                # Either file changed: the gateway pods roll and read it (no live reload).
                "metadata": {"labels": _labels(ctx),
                             "annotations": {"inferplane.io/fleet-sha256": config_hash,
                                             "inferplane.io/plan-sha256": plan_hash}},
                "spec": {
                    "serviceAccountName": GATEWAY_NAME,  # rbac(): watches EndpointSlices
                    "containers": [container],
                    "enableServiceLinks": False,
                    "terminationGracePeriodSeconds": drain_s + ctx.options.grace_margin_s,
                    "topologySpreadConstraints": [{
                        "maxSkew": 1,
                        "topologyKey": "kubernetes.io/hostname",
                        "whenUnsatisfiable": "ScheduleAnyway",
                        "labelSelector": {"matchLabels": _selector()},
                    }],
                    # One directory, two ConfigMaps: fleet.yaml and plan.json.
                    "volumes": [{"name": "fleet", "projected": {"sources": [
                        {"configMap": {"name": CONFIG_NAME}},
                        {"configMap": {"name": PLAN_CONFIG_NAME}},
                    ]}}],
                },
            },
        },
    }


def service(ctx: K8sContext) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": ctx.metadata(GATEWAY_NAME, "gateway"),
        "spec": {
            "type": "ClusterIP",
            "selector": _selector(),
            "ports": [{"name": "http", "port": ctx.fleet.gateway.port, "targetPort": "http",
                       "protocol": "TCP"}],
        },
    }


def pdb(ctx: K8sContext) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": ctx.metadata(GATEWAY_NAME, "gateway"),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": _selector()}},
    }


def ingress(ctx: K8sContext, host: str) -> dict[str, Any]:
    """ingress-nginx defaults to a 1 MiB body (413 on long prompts, P41) and 60 s reads
    (cuts long generations, P40); both are set from the fleet's gateway settings."""
    gw = ctx.fleet.gateway
    body_mib = math.ceil(gw.max_body_mib)
    read_s = math.ceil(gw.timeouts.total_s)
    meta = ctx.metadata(GATEWAY_NAME, "gateway")
    meta["annotations"] = {
        "nginx.ingress.kubernetes.io/proxy-body-size": f"{body_mib}m",
        "nginx.ingress.kubernetes.io/proxy-read-timeout": str(read_s),
        "nginx.ingress.kubernetes.io/proxy-send-timeout": str(read_s),
        "nginx.ingress.kubernetes.io/proxy-connect-timeout": str(
            math.ceil(min(gw.timeouts.connect_s, 75))
        ),
        "nginx.ingress.kubernetes.io/proxy-buffering": "off",  # stream tokens as they come
    }
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": meta,
        "spec": {
            "ingressClassName": ctx.options.ingress_class,
            "rules": [{
                "host": host,
                "http": {"paths": [{
                    "path": "/v1",
                    "pathType": "Prefix",
                    "backend": {"service": {"name": GATEWAY_NAME,
                                            "port": {"name": "http"}}},
                }]},
            }],
        },
    }
