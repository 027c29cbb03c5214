"""PodMonitors, a PrometheusRule with S2's thresholds (P49) and a Grafana dashboard.

The dashboard shows KV-cache usage as load, never raw GPU memory, which vLLM keeps at its
utilization target all the time (P47), and splits latency into gateway queue wait versus
engine time (P48).
"""

from __future__ import annotations

import json
from typing import Any

from inferplane.deploy.k8s.context import K8sContext
from inferplane.deploy.k8s.services import model_selector
from inferplane.deploy.names import LABEL_COMPONENT, LABEL_PART_OF, PART_OF, port_name
from inferplane.deploy.names import object_name as _object_name
from inferplane.engines import engine_for
from inferplane.engines import metrics as metric

# The engines' current metric names, from the engine boundary's vocabulary (PromQL).
_NAMES = engine_for("vllm").metrics
KV_USAGE = _NAMES[metric.KV_CACHE_USAGE][0]
WAITING = _NAMES[metric.REQUESTS_WAITING][0]
RUNNING = _NAMES[metric.REQUESTS_RUNNING][0]
GEN_TOKENS = _NAMES[metric.GENERATION_TOKENS][0] + "_total"
WAITING_ALERT = 20
KV_ALERT = 0.95
RUNNING_ALERT_FRACTION = 0.8
THROUGHPUT_ALERT_FRACTION = 0.5


def pod_monitor(ctx: K8sContext, model: str) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": ctx.metadata(_object_name(model), "engine"),
        "spec": {
            "selector": {"matchLabels": model_selector(ctx, model)},
            "podMetricsEndpoints": [
                {"port": port_name(model), "path": "/metrics", "interval": "15s"}
            ],
        },
    }


def gateway_pod_monitor(ctx: K8sContext) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": ctx.metadata("inferplane-gateway", "gateway"),
        "spec": {
            "selector": {"matchLabels": {LABEL_PART_OF: PART_OF, LABEL_COMPONENT: "gateway"}},
            "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}],
        },
    }


def _sel(ctx: K8sContext, model: str) -> str:
    return f'{{namespace="{ctx.namespace}", model_name="{ctx.served_name(model)}"}}'


def _max_num_seqs(ctx: K8sContext, model: str) -> int:
    return max(inst.max_num_seqs for inst in ctx.plan.instances_of(model))


def prometheus_rule(ctx: K8sContext) -> dict[str, Any]:
    """S2's alerts per model: running > 0.8 x max_num_seqs, waiting > 20, KV usage > 0.95,
    generation throughput under half of the same hour yesterday (P49)."""
    rules: list[dict[str, Any]] = []
    for model in ctx.models:
        sel = _sel(ctx, model)
        labels = {"model": model, "severity": "warning"}
        running_limit = RUNNING_ALERT_FRACTION * _max_num_seqs(ctx, model)
        rules += [
            {
                "alert": "InferplaneEngineNearMaxNumSeqs",
                "expr": f"max by (pod) ({RUNNING}{sel}) > {running_limit:g}",
                "for": "5m",
                "labels": labels,
                "annotations": {
                    "summary": f"{model}: running requests above 80% of max_num_seqs "
                               f"({_max_num_seqs(ctx, model)}) on {{{{ $labels.pod }}}}",
                    "description": "Add replicas or raise max_num_seqs if the KV pool allows.",
                },
            },
            {
                "alert": "InferplaneEngineQueueBacklog",
                "expr": f"max by (pod) ({WAITING}{sel}) > {WAITING_ALERT}",
                "for": "2m",
                "labels": labels,
                "annotations": {
                    "summary": f"{model}: more than {WAITING_ALERT} requests waiting "
                               "in the engine on {{ $labels.pod }}",
                    "description": "The engine queue grows: scale out or shed load at the "
                                   "gateway (P37).",
                },
            },
            {
                "alert": "InferplaneKvCacheFull",
                "expr": f"max by (pod) ({KV_USAGE}{sel}) > {KV_ALERT}",
                "for": "5m",
                "labels": labels,
                "annotations": {
                    "summary": f"{model}: KV cache above 95% on {{{{ $labels.pod }}}}",
                    "description": "Requests will be preempted; KV usage, not GPU memory, "
                                   "is the load signal (P47).",
                },
            },
            {
                "alert": "InferplaneThroughputDropped",
                "expr": (
                    f"sum(rate({GEN_TOKENS}{sel}[10m])) < {THROUGHPUT_ALERT_FRACTION} * "
                    f"sum(rate({GEN_TOKENS}{sel}[10m] offset 1d)) "
                    f"and sum(rate({GEN_TOKENS}{sel}[10m] offset 1d)) > 0"
                ),
                "for": "15m",
                "labels": labels,
                "annotations": {
                    "summary": f"{model}: generation throughput below 50% of the same "
                               "time yesterday",
                    "description": "Check for preemption, a degraded GPU or a changed "
                                   "traffic mix.",
                },
            },
        ]
    gateway_rules = [
        {
            "alert": "InferplaneGatewayQueueWait",
            "expr": (
                "histogram_quantile(0.95, sum by (le, model) "
                f'(rate(inferplane_queue_wait_seconds_bucket{{namespace="{ctx.namespace}"}}'
                "[5m]))) > 5"
            ),
            "for": "5m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "{{ $labels.model }}: p95 gateway queue wait above 5 s",
                "description": "Latency is spent in the gateway queue, not the engine (P48).",
            },
        }
    ]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": ctx.metadata("inferplane", "monitoring"),
        "spec": {
            "groups": [
                {"name": "inferplane-engines", "rules": rules},
                {"name": "inferplane-gateway", "rules": gateway_rules},
            ]
        },
    }


def _panel(pid: int, title: str, exprs: list[tuple[str, str]], unit: str, y: int, x: int,
           maximum: float | None = None) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": unit}
    if maximum is not None:
        defaults["max"] = maximum
        defaults["min"] = 0
    return {
        "id": pid,
        "type": "timeseries",
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(exprs)
        ],
    }


def dashboard(ctx: K8sContext) -> dict[str, Any]:
    ns = f'namespace="{ctx.namespace}"'
    panels = [
        _panel(1, "KV-cache usage per replica (the load signal, P47)",
               [(f"{KV_USAGE}{{{ns}}}", "{{model_name}} {{pod}}")], "percentunit", 0, 0, 1.0),
        _panel(2, "Requests waiting in the engine",
               [(f"sum by (model_name) ({WAITING}{{{ns}}})", "{{model_name}}")], "short", 0, 12),
        _panel(3, "p95 gateway queue wait vs engine time to first token (P48)", [
            ("histogram_quantile(0.95, sum by (le, model) "
             f"(rate(inferplane_queue_wait_seconds_bucket{{{ns}}}[5m])))", "queue {{model}}"),
            ("histogram_quantile(0.95, sum by (le, model) "
             f"(rate(inferplane_upstream_ttft_seconds_bucket{{{ns}}}[5m])))", "engine {{model}}"),
        ], "s", 8, 0),
        _panel(4, "Running requests",
               [(f"sum by (model_name) ({RUNNING}{{{ns}}})", "{{model_name}}")], "short", 8, 12),
        _panel(5, "Generation tokens/s",
               [(f"sum by (model_name) (rate({GEN_TOKENS}{{{ns}}}[5m]))", "{{model_name}}")],
               "short", 16, 0),
        _panel(6, "Gateway requests/s by status", [
            (f"sum by (model, status) (rate(inferplane_requests_total{{{ns}}}[5m]))",
             "{{model}} {{status}}"),
        ], "reqps", 16, 12),
    ]
    return {
        "title": f"inferplane ({ctx.namespace})",
        "uid": _object_name(f"inferplane-{ctx.namespace}", max_chars=40),
        "schemaVersion": 39,
        "editable": True,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "tags": ["inferplane", "vllm"],
        "templating": {"list": [{"name": "datasource", "type": "datasource",
                                 "query": "prometheus", "label": "Prometheus"}]},
        "panels": panels,
    }


def dashboard_configmap(ctx: K8sContext) -> dict[str, Any]:
    """The dashboard as a ConfigMap the Grafana sidecar picks up (label grafana_dashboard)."""
    text = json.dumps(dashboard(ctx), indent=2, sort_keys=True) + "\n"
    meta = ctx.metadata("inferplane-dashboard", "monitoring", grafana_dashboard="1")
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
            "data": {"inferplane.json": text}}
