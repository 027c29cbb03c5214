"""The gateway: ConfigMap (the fleet file), Deployment (>= 2 replicas), Service, PDB and an
optional Ingress with an explicit body limit (P41) and long timeouts (P40)."""

from __future__ import annotations

import math
from typing import Any

from inferplane.deploy.k8s.context import K8sContext
from inferplane.deploy.k8s.services import service_url
from inferplane.deploy.names import LABEL_COMPONENT, LABEL_PART_OF, PART_OF

GATEWAY_NAME = "inferplane-gateway"
CONFIG_NAME = "inferplane-fleet"
CONFIG_MOUNT = "/etc/inferplane"


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


def gateway_args(ctx: K8sContext) -> list[str]:
    args = ["gateway", "--fleet", f"{CONFIG_MOUNT}/fleet.yaml", "--host", "0.0.0.0",
            "--port", str(ctx.fleet.gateway.port)]
    for model in ctx.models:
        args += ["--backend", f"{model}={service_url(ctx, model)}"]
    return args


def deployment(ctx: K8sContext, config_hash: str) -> dict[str, Any]:
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
                "metadata": {"labels": _labels(ctx),
                             "annotations": {"inferplane.io/fleet-sha256": config_hash}},
                "spec": {
                    "containers": [container],
                    "enableServiceLinks": False,
                    "terminationGracePeriodSeconds": drain_s + ctx.options.grace_margin_s,
                    "topologySpreadConstraints": [{
                        "maxSkew": 1,
                        "topologyKey": "kubernetes.io/hostname",
                        "whenUnsatisfiable": "ScheduleAnyway",
                        "labelSelector": {"matchLabels": _selector()},
                    }],
                    "volumes": [{"name": "fleet", "configMap": {"name": CONFIG_NAME}}],
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
