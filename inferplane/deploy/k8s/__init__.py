"""Kubernetes manifests from a Plan: a kustomize-ready directory of YAML files.

Layout (one file per object kind per workload or model):
  engines/<workload>/deployment.yaml, pdb.yaml [, podgroup.yaml with --gang volcano]
  engines/<model>-lws/leaderworkerset.yaml, pdb.yaml (replicas that span nodes)
  models/<model>/service.yaml, podmonitor.yaml, scaledobject.yaml | hpa.yaml
                [, pvc.yaml with --weights pvc | prewarm.yaml with --weights prewarm]
                [, inferencepool.yaml with --inference-pool,
                   epp-deployment.yaml, epp-service.yaml with --epp-image]
  gateway/configmap.yaml (fleet file, plan), rbac.yaml, deployment.yaml, service.yaml,
          pdb.yaml, podmonitor.yaml,
          ingress.yaml
  monitoring/prometheusrule.yaml, dashboard.yaml
  epp/rbac.yaml (with --epp-image)
  kustomization.yaml
"""

from __future__ import annotations

import hashlib
from typing import Any

from inferplane.deploy.k8s import (
    autoscaling,
    gang,
    gateway,
    inference_pool,
    leaderworkerset,
    monitoring,
    pdb,
    services,
    weights,
    workloads,
)
from inferplane.deploy.k8s.context import K8sContext
from inferplane.deploy.names import object_name
from inferplane.deploy.options import RenderOptions
from inferplane.planner.plan import Plan
from inferplane.spec import FleetSpec

Files = dict[str, list[dict[str, Any]]]


def render_k8s(fleet: FleetSpec, plan: Plan, options: RenderOptions, fleet_text: str) -> Files:
    """Every object by relative file path; the caller dumps and writes them."""
    ctx = K8sContext(fleet, plan, options)
    files: Files = {}
    for workload in ctx.workloads:
        base = f"engines/{workload.name}"
        files[f"{base}/pdb.yaml"] = [pdb.pdb(ctx, workload)]
        if workload.spans_nodes:
            files[f"{base}/leaderworkerset.yaml"] = [
                leaderworkerset.leader_worker_set(ctx, workload)]
            continue
        dep = workloads.deployment(ctx, workload)
        files[f"{base}/deployment.yaml"] = [dep]
        if gang.static_pod_group(ctx, workload):
            files[f"{base}/podgroup.yaml"] = [
                gang.pod_group(ctx, workload, dep["spec"]["template"]["spec"])]
    pvc_models = weights.pvc_models(ctx)
    prewarmed = weights.prewarmed_models(ctx)
    for model in ctx.models:
        base = f"models/{object_name(model)}"
        files[f"{base}/service.yaml"] = [services.service(ctx, model)]
        files[f"{base}/podmonitor.yaml"] = [monitoring.pod_monitor(ctx, model)]
        if model in pvc_models:
            files[f"{base}/pvc.yaml"] = [weights.pvc(ctx, model)]
        if model in prewarmed:
            files[f"{base}/prewarm.yaml"] = [weights.prewarm_daemonset(ctx, model)]
    if options.inference_pool:
        for model in inference_pool.pooled_models(ctx):
            base = f"models/{object_name(model)}"
            files[f"{base}/inferencepool.yaml"] = [inference_pool.inference_pool(ctx, model)]
            if options.epp_image:
                files[f"{base}/epp-deployment.yaml"] = [
                    inference_pool.epp_deployment(ctx, model, options.epp_image)]
                files[f"{base}/epp-service.yaml"] = [inference_pool.epp_service(ctx, model)]
        if options.epp_image and inference_pool.pooled_models(ctx):
            files["epp/rbac.yaml"] = inference_pool.epp_rbac(ctx)
    if options.autoscaler != "none":
        scaled = autoscaling.scaled_workloads(ctx)
        for workload, bounds in scaled:
            base = f"models/{object_name(workload.models[0])}"
            if options.autoscaler == "keda":
                files[f"{base}/scaledobject.yaml"] = [
                    autoscaling.scaled_object(ctx, workload, bounds)
                ]
            else:
                files[f"{base}/hpa.yaml"] = [autoscaling.hpa(ctx, workload, bounds)]
        if scaled and options.autoscaler == "hpa":
            files["monitoring/prometheus-adapter-rules.yaml"] = [autoscaling.adapter_rules(ctx)]
    config_hash = hashlib.sha256(fleet_text.encode()).hexdigest()[:16]
    files["gateway/configmap.yaml"] = [gateway.config_map(ctx, fleet_text),
                                       gateway.plan_config_map(ctx)]
    files["gateway/deployment.yaml"] = [gateway.deployment(ctx, config_hash)]
    files["gateway/service.yaml"] = [gateway.service(ctx)]
    files["gateway/pdb.yaml"] = [gateway.pdb(ctx)]
    files["gateway/rbac.yaml"] = gateway.rbac(ctx)
    files["gateway/podmonitor.yaml"] = [monitoring.gateway_pod_monitor(ctx)]
    if options.ingress_host:
        files["gateway/ingress.yaml"] = [gateway.ingress(ctx, options.ingress_host)]
    files["monitoring/prometheusrule.yaml"] = [monitoring.prometheus_rule(ctx)]
    files["monitoring/dashboard.yaml"] = [monitoring.dashboard_configmap(ctx)]
    files["kustomization.yaml"] = [kustomization(options, sorted(files))]
    return files


def kustomization(options: RenderOptions, resources: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": options.namespace,
        "resources": resources,
    }
