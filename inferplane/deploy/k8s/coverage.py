"""Where every fleet field goes in a Kubernetes render, and a warning for each one it loses.

`FIELDS` names every leaf of the fleet spec (list items and dict values collapse: the path
of `models[3].placement.node` is `models.placement.node`) with how the render keeps it:

- `plan`: the planner consumed it, so it arrives as the plan's argv, env and placement;
- `gateway`: the gateway pods read it from the fleet file in the `inferplane-fleet`
  ConfigMap (routing, timeouts, limits, routes, ...);
- `rendered`: the renderer writes it into an object (an image, node labels, KEDA bounds);
- `warn`: Kubernetes cannot express it (or not as set): `warnings()` says so whenever the
  fleet file uses it, never a silent drop.

A test walks the spec models and fails on a field missing here, so a new fleet field must
be placed in one of these before it can ship.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal
from urllib.parse import urlsplit

from inferplane.deploy.k8s.context import K8sContext

Coverage = Literal["plan", "gateway", "rendered", "warn"]

FIELDS: dict[str, Coverage] = {
    "engine.kind": "rendered", "engine.device": "rendered", "engine.version": "rendered",
    "engine.image": "rendered", "engine.extra_env": "plan",
    "gpus.nodes.name": "plan", "gpus.nodes.gpu_type": "rendered", "gpus.nodes.count": "plan",
    "gpus.nodes.interconnect": "plan", "gpus.nodes.labels": "rendered",
    "gpus.nodes.sharing": "rendered", "gpus.nodes.mig_profile": "rendered",
    # The plan's NIC names a host interface; a pod's is the CNI's eth0 (leaderworkerset.py).
    "gpus.nodes.network_interface": "rendered",
    "gpus.nodes.host_memory_gib": "plan", "gpus.nodes.cpu_cores": "plan",
    "models.name": "rendered", "models.source": "plan", "models.endpoints": "gateway",
    "models.served_model_name": "plan", "models.aliases": "gateway", "models.task": "plan",
    "models.dtype": "plan", "models.quantization": "plan", "models.kv_cache_dtype": "plan",
    "models.max_model_len": "plan", "models.max_num_seqs": "plan",
    "models.max_num_batched_tokens": "plan", "models.tensor_parallel_size": "plan",
    "models.pipeline_parallel_size": "plan", "models.replicas": "rendered",
    "models.gpu_memory_utilization": "plan", "models.kv_cache_memory_gib": "plan",
    "models.enforce_eager": "plan", "models.cpu_cores": "plan", "models.extra_args": "plan",
    "models.env": "plan",
    "models.placement.colocate_with": "plan", "models.placement.node": "rendered",
    "models.placement.gpu_type": "plan", "models.placement.exclusive": "plan",
    "models.routing.policy": "gateway", "models.routing.session_header": "gateway",
    "models.routing.max_queue_depth": "gateway", "models.routing.max_queue_wait_s": "gateway",
    "models.routing.long_prompt.threshold_tokens": "gateway",
    "models.routing.long_prompt.model": "gateway", "models.routing.retries": "gateway",
    "models.routing.eject_after_failures": "gateway",
    "models.routing.eject_after_5xx": "gateway",
    "models.routing.max_ejection_percent": "gateway",
    "models.max_tokens_cap.limit": "gateway", "models.max_tokens_cap.action": "gateway",
    "models.timeouts.connect_s": "gateway", "models.timeouts.first_byte_s": "gateway",
    "models.timeouts.idle_s": "gateway", "models.timeouts.total_s": "gateway",
    # LoRA: the engine flags come from the plan; adapter dirs are mounted (deploy/k8s/weights.py)
    "models.lora.max_loras": "plan", "models.lora.max_lora_rank": "plan",
    "models.lora.max_cpu_loras": "plan", "models.lora.adapters.name": "plan",
    "models.lora.adapters.source": "rendered", "models.lora.adapters.aliases": "gateway",
    # The pods listen on every interface whatever the fleet says (a pod must).
    "gateway.host": "rendered", "gateway.port": "rendered", "gateway.max_body_mib": "rendered",
    "gateway.timeouts.connect_s": "rendered", "gateway.timeouts.first_byte_s": "gateway",
    "gateway.timeouts.idle_s": "gateway", "gateway.timeouts.total_s": "rendered",
    "gateway.connections.header_timeout_s": "gateway",
    "gateway.connections.body_timeout_s": "gateway",
    "gateway.connections.body_total_timeout_s": "gateway",
    "gateway.connections.keepalive_timeout_s": "gateway",
    "gateway.connections.send_timeout_s": "gateway",
    "gateway.connections.max_header_bytes": "gateway",
    "gateway.connections.max_connections": "gateway", "gateway.connections.fd_reserve": "gateway",
    "gateway.auth": "gateway", "gateway.database_url": "warn", "gateway.redis_url": "warn",
    "gateway.redis_sync_s": "gateway", "gateway.server": "gateway",
    "gateway.admin_token_env": "gateway", "gateway.metrics_token_env": "warn",
    "gateway.ratelimit_headers": "gateway", "gateway.priority_header": "gateway",
    "gateway.access_log_path": "warn", "gateway.console": "warn",
    "gateway.console_allowed_hosts": "warn", "gateway.expose_replica_header": "gateway",
    "gateway.image": "rendered",
    "gateway.tracing.otlp_endpoint": "gateway", "gateway.tracing.service_name": "gateway",
    "gateway.tracing.sample_ratio": "gateway",
    "routes.model": "gateway", "routes.backends.target": "gateway",
    "routes.backends.weight": "gateway",
    "limits.per_key.rpm": "gateway", "limits.per_key.tpm": "gateway",
    "limits.per_key.max_concurrent": "gateway",
    "scaling.policy.target_waiting_requests": "rendered",
    "scaling.policy.target_kv_cache_usage": "rendered",
    "scaling.policy.scale_up_window_s": "rendered",
    "scaling.policy.scale_down_window_s": "rendered",
    "scaling.policy.stabilization_s": "rendered",
    "scaling.policy.target_ttft_p95_s": "warn", "scaling.policy.target_itl_p95_s": "warn",
    "scaling.models.min_replicas": "warn", "scaling.models.max_replicas": "warn",
    "scaling.models.policy.target_waiting_requests": "rendered",
    "scaling.models.policy.target_kv_cache_usage": "rendered",
    "scaling.models.policy.scale_up_window_s": "rendered",
    "scaling.models.policy.scale_down_window_s": "rendered",
    "scaling.models.policy.stabilization_s": "rendered",
    "scaling.models.policy.target_ttft_p95_s": "warn",
    "scaling.models.policy.target_itl_p95_s": "warn",
    "scaling.models.sleep.level": "warn",
    "planning.objective": "plan",
}


def _gateway(ctx: K8sContext) -> list[str]:
    gw = ctx.fleet.gateway
    pods = ctx.options.gateway_replicas
    out: list[str] = []
    if gw.access_log_path is not None:
        out.append(f"gateway.access_log_path: the gateway pods would write {gw.access_log_path} "
                   "inside their containers (lost on restart, not in `kubectl logs`); not "
                   "rendered, they log to stderr")
    if "console" in gw.model_fields_set and gw.console:
        out.append("gateway.console: the web console comes with `inferplane up`; the gateway "
                   "pods (`inferplane gateway`) serve none")
    if gw.console_allowed_hosts:
        out.append("gateway.console_allowed_hosts: no console is served in the cluster "
                   "(see gateway.console), so the hosts are unused")
    if gw.metrics_token_env is not None:
        out.append(f"gateway.metrics_token_env: the rendered gateway pods do not set "
                   f"${gw.metrics_token_env}, so /metrics is open until you add it from a "
                   "Secret (a kustomize patch on gateway/deployment.yaml)")
    if gw.database_url is None and pods > 1:
        out.append(f"gateway.database_url is not set: each of the {pods} gateway pods keeps "
                   "keys, usage and routes in its own SQLite file inside the pod (not shared, "
                   "lost on restart); set a PostgreSQL URL, or give the pods "
                   "$INFERPLANE_DATABASE_URL_FILE from a Secret")
    elif gw.database_url is not None and urlsplit(gw.database_url).password:
        out.append("gateway.database_url holds a password, and the fleet file goes into the "
                   "ConfigMap inferplane-fleet in clear text; give the pods "
                   "$INFERPLANE_DATABASE_URL_FILE from a Secret instead")
    if gw.redis_url is None and pods > 1:
        out.append(f"gateway.redis_url is not set: each of the {pods} gateway pods counts rate "
                   f"limits on its own (a key gets up to {pods}x its limit); set a Redis URL "
                   "(or $INFERPLANE_REDIS_URL in the pods)")
    return out


def _scaling(ctx: K8sContext) -> list[str]:
    scaling = ctx.fleet.scaling
    auto = ctx.options.autoscaler
    out: list[str] = []
    policies = [("scaling.policy", scaling.policy)] + [
        (f"scaling.models.{name}.policy", b.policy)
        for name, b in sorted(scaling.models.items()) if b.policy is not None]
    for where, policy in policies:
        for field in ("target_ttft_p95_s", "target_itl_p95_s"):
            if getattr(policy, field) is not None:
                out.append(f"{where}.{field}: not rendered; KEDA/HPA scale on the engines' "
                           "queue (and KV-cache usage), not on latency")
    for name, bounds in sorted(scaling.models.items()):
        if auto == "none":
            out.append(f"scaling.models.{name}: --autoscaler none renders no autoscaler; the "
                       "replica count stays the plan's")
        elif auto == "hpa" and bounds.min_replicas == 0:
            out.append(f"scaling.models.{name}.min_replicas: 0 is not possible with an HPA; "
                       "rendered as 1 (use --autoscaler keda to scale to zero)")
        if bounds.sleep is not None:
            out.append(f"scaling.models.{name}.sleep: sleep mode belongs to the local "
                       "autoscaler of `inferplane up`; in the cluster KEDA/HPA add and remove "
                       "pods instead")
    return out


def _pools(ctx: K8sContext) -> list[str]:
    from inferplane.deploy.k8s import inference_pool as gie

    if not ctx.options.inference_pool:
        return []
    out = [f"models[{m}]: no InferencePool: its pods serve it on ports "
           f"{', '.join(str(p) for p in gie.model_ports(ctx, m))}, and a pool tries every "
           "port on every pod it selects" for m in ctx.models if m not in gie.pooled_models(ctx)]
    if ctx.options.epp_image is None and gie.pooled_models(ctx):
        out.append("--inference-pool without --epp-image: each pool names an endpoint picker "
                   "Service <model>-epp (port 9002) that this render does not run; install "
                   "one, or render with --epp-image (docs/deploy.md)")
    return out


CHECKS: tuple[Callable[[K8sContext], list[str]], ...] = (_gateway, _scaling, _pools)


def warnings(ctx: K8sContext) -> list[str]:
    """What this render cannot express of the fleet file, one sentence each."""
    return [w for check in CHECKS for w in check(ctx)]
