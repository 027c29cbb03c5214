"""Autoscaling on the engine queue, never CPU (P46): KEDA by default, HPA v2 as the option.

The same `scaling:` numbers as the local autoscaler of `inferplane up` (docs/scaling.md has
the table): up when `vllm:num_requests_waiting` per replica stays above the target for
`scale_up_window_s` (the HPA's scale-up stabilization window keeps the lowest
recommendation of that window); down one replica per `scale_down_window_s` after the load
stayed low for `max(scale_down_window_s, stabilization_s)` (the scale-down window keeps
the highest recommendation, so no down follows an up within it, P50). The floor is the
model's `min_replicas` (1 by default: a scaled-to-zero model takes minutes to come back,
P28). With `min_replicas: 0` (KEDA only) a second trigger on the gateway's own queue,
`inferplane_queue_depth`, activates the workload from zero: the engines' queue cannot,
since no engine runs to report it, while the gateway holds the first request.
"""

from __future__ import annotations

from typing import Any

from inferplane.deploy.k8s.context import K8sContext, Workload
from inferplane.deploy.k8s.monitoring import KV_USAGE, WAITING
from inferplane.deploy.names import object_name
from inferplane.errors import InferplaneError
from inferplane.spec import ModelScaling, ScalingPolicy


def scaled_workloads(ctx: K8sContext) -> list[tuple[Workload, ModelScaling]]:
    out: list[tuple[Workload, ModelScaling]] = []
    for model, bounds in sorted(ctx.fleet.scaling.models.items()):
        workloads = ctx.workload_of(model)
        if not workloads:
            continue
        if any(w.colocated for w in workloads) or len(workloads) != 1:
            raise InferplaneError(
                "a model that shares its pod with another model cannot scale on its own",
                field=f"scaling.models.{model}",
                value=model,
                fix="remove its scaling bounds, or stop co-locating it "
                    "(placement.colocate_with)",
            )
        out.append((workloads[0], bounds))
    return out


HPA_MAX_WINDOW_S = 3600  # the API's bound on stabilizationWindowSeconds
HPA_MAX_PERIOD_S = 1800  # ... and on a policy's periodSeconds


def _behavior(policy: ScalingPolicy) -> dict[str, Any]:
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": int(policy.scale_up_window_s),
            "selectPolicy": "Max",
            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": min(
                HPA_MAX_WINDOW_S, int(max(policy.scale_down_window_s, policy.stabilization_s))
            ),
            "selectPolicy": "Min",
            "policies": [{"type": "Pods", "value": 1,
                          "periodSeconds": min(HPA_MAX_PERIOD_S,
                                               int(policy.scale_down_window_s))}],
        },
    }


GATEWAY_QUEUE = "inferplane_queue_depth"  # the gateway's per-model queue, held requests too


def scaled_object(ctx: K8sContext, workload: Workload, bounds: ModelScaling) -> dict[str, Any]:
    model = workload.models[0]
    policy = ctx.fleet.scaling.policy_for(model)
    sel = f'namespace="{ctx.namespace}", model_name="{ctx.served_name(model)}"'
    triggers: list[dict[str, Any]] = [{
        "type": "prometheus",
        "name": "waiting",
        "metricType": "AverageValue",
        "metadata": {
            "serverAddress": ctx.options.prometheus_url,
            "query": f"sum({WAITING}{{{sel}}})",
            "threshold": str(policy.target_waiting_requests),
        },
    }]
    if policy.target_kv_cache_usage is not None:
        triggers.append({
            "type": "prometheus",
            "name": "kv-usage",
            "metricType": "Value",
            "metadata": {
                "serverAddress": ctx.options.prometheus_url,
                "query": f"avg({KV_USAGE}{{{sel}}})",
                "threshold": f"{policy.target_kv_cache_usage:g}",
            },
        })
    if bounds.min_replicas == 0:
        # Scale from zero: requests the gateway holds for the model activate it (> 0).
        triggers.append({
            "type": "prometheus",
            "name": "held",
            "metricType": "AverageValue",
            "metadata": {
                "serverAddress": ctx.options.prometheus_url,
                "query": f'sum({GATEWAY_QUEUE}{{namespace="{ctx.namespace}", '
                         f'model="{model}"}})',
                "threshold": str(policy.target_waiting_requests),
                "activationThreshold": "0",
            },
        })
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": ctx.metadata(workload.name, "autoscaling"),
        "spec": {
            "scaleTargetRef": workload.target_ref(),
            "minReplicaCount": bounds.min_replicas,
            "maxReplicaCount": bounds.max_replicas,
            "pollingInterval": 15,
            "cooldownPeriod": int(policy.scale_down_window_s),
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": _behavior(policy)}},
            "triggers": triggers,
        },
    }


HPA_METRIC = "vllm_num_requests_waiting"


def hpa(ctx: K8sContext, workload: Workload, bounds: ModelScaling) -> dict[str, Any]:
    model = workload.models[0]
    policy = ctx.fleet.scaling.policy_for(model)
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": ctx.metadata(workload.name, "autoscaling"),
        "spec": {
            "scaleTargetRef": workload.target_ref(),
            "minReplicas": max(1, bounds.min_replicas),  # HPA cannot go to 0
            "maxReplicas": bounds.max_replicas,
            "behavior": _behavior(policy),
            "metrics": [{
                "type": "Pods",
                "pods": {
                    "metric": {"name": HPA_METRIC},
                    "target": {"type": "AverageValue",
                               "averageValue": str(policy.target_waiting_requests)},
                },
            }],
        },
    }


def adapter_rules(ctx: K8sContext) -> dict[str, Any]:
    """Prometheus Adapter rules exposing `vllm:num_requests_waiting` per pod to the HPA."""
    rules = {
        "rules": [{
            "seriesQuery": f'{WAITING}{{namespace!="",pod!=""}}',
            "resources": {"overrides": {"namespace": {"resource": "namespace"},
                                        "pod": {"resource": "pod"}}},
            "name": {"matches": "^vllm:num_requests_waiting$", "as": HPA_METRIC},
            "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
        }]
    }
    import yaml

    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": ctx.metadata(object_name("inferplane-prometheus-adapter-rules"),
                                 "autoscaling"),
        "data": {"config.yaml": yaml.safe_dump(rules, sort_keys=True)},
    }
