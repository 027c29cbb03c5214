"""One `scaling:` policy, three autoscalers: the local one, KEDA and the HPA (the table
in docs/scaling.md, checked field by field)."""

from __future__ import annotations

from typing import Any, Literal

import pytest
import yaml
from deploy_plans import s4

from inferplane.deploy import RenderOptions, render_files
from inferplane.scaling.policy import ModelAutoscaler
from inferplane.spec import FleetSpec, ModelScaling, ScalingPolicy, ScalingSpec

POLICIES = [
    ScalingPolicy(),  # the defaults
    ScalingPolicy(target_waiting_requests=3, target_kv_cache_usage=0.8, scale_up_window_s=30,
                  scale_down_window_s=200, stabilization_s=900),  # stabilization dominates
    ScalingPolicy(scale_up_window_s=10, scale_down_window_s=7200, stabilization_s=60),  # caps
]


def _with(policy: ScalingPolicy, bounds: ModelScaling) -> FleetSpec:
    fleet, _, _ = s4()
    return fleet.model_copy(update={"scaling": ScalingSpec(policy=policy,
                                                           models={"qwen3-8b": bounds})})


def _render(fleet: FleetSpec, autoscaler: Literal["keda", "hpa"] = "keda") -> dict[str, Any]:
    _, plan, text = s4()
    files = render_files(fleet, plan, "k8s", RenderOptions(fleet_text=text,
                                                           autoscaler=autoscaler))
    name = "scaledobject" if autoscaler == "keda" else "hpa"
    doc: dict[str, Any] = yaml.safe_load(files[f"models/qwen3-8b/{name}.yaml"])
    return doc


@pytest.mark.parametrize("policy", POLICIES)
def test_keda_and_hpa_follow_the_same_numbers_as_the_local_autoscaler(
    policy: ScalingPolicy,
) -> None:
    bounds = ModelScaling(min_replicas=1, max_replicas=4)
    fleet = _with(policy, bounds)
    local = ModelAutoscaler("qwen3-8b", bounds, fleet.scaling.policy_for("qwen3-8b"))
    so = _render(fleet)["spec"]
    hpa = _render(fleet, "hpa")["spec"]
    down_window = min(3600, int(max(policy.scale_down_window_s, policy.stabilization_s)))
    down_period = min(1800, int(policy.scale_down_window_s))
    for behavior in (so["advanced"]["horizontalPodAutoscalerConfig"]["behavior"],
                     hpa["behavior"]):
        assert behavior["scaleUp"]["stabilizationWindowSeconds"] == int(
            local.policy.scale_up_window_s)
        assert behavior["scaleUp"]["policies"] == [
            {"type": "Pods", "value": 1, "periodSeconds": 60}]  # one replica at a time
        assert behavior["scaleDown"]["stabilizationWindowSeconds"] == down_window
        assert behavior["scaleDown"]["policies"] == [
            {"type": "Pods", "value": 1, "periodSeconds": down_period}]
    assert (so["minReplicaCount"], so["maxReplicaCount"]) == (1, 4)
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (1, 4)
    assert so["cooldownPeriod"] == int(policy.scale_down_window_s)
    waiting = so["triggers"][0]
    assert waiting["metadata"]["threshold"] == str(policy.target_waiting_requests)
    assert waiting["metricType"] == "AverageValue"  # per replica, like the local signal
    target = hpa["metrics"][0]["pods"]["target"]
    assert target == {"type": "AverageValue",
                      "averageValue": str(policy.target_waiting_requests)}
    kv = [t for t in so["triggers"] if t["name"] == "kv-usage"]
    if policy.target_kv_cache_usage is None:
        assert kv == []
    else:
        assert kv[0]["metadata"]["threshold"] == f"{policy.target_kv_cache_usage:g}"
    assert not [t for t in so["triggers"] if t["name"] == "held"]  # floor 1: no activation


def test_min_replicas_zero_activates_on_the_gateways_held_requests() -> None:
    fleet = _with(ScalingPolicy(), ModelScaling(min_replicas=0, max_replicas=2))
    so = _render(fleet)["spec"]
    assert so["minReplicaCount"] == 0
    [held] = [t for t in so["triggers"] if t["name"] == "held"]
    assert held["metadata"]["activationThreshold"] == "0"
    assert held["metadata"]["query"] == (
        'sum(inferplane_queue_depth{namespace="inferplane", model="qwen3-8b"})')
    assert held["metadata"]["threshold"] == "5"
    # the HPA cannot go to zero: its floor stays 1
    assert _render(fleet, "hpa")["spec"]["minReplicas"] == 1
