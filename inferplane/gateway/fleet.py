"""The one adapter from the fleet file (`inferplane.spec`) to the gateway's own config."""

from __future__ import annotations

import os

from inferplane.gateway.config import (
    Admission,
    ConnectionLimits,
    GatewayConfig,
    LongPromptLane,
    ModelRoute,
    Timeouts,
    WeightedRoute,
    WeightedTarget,
)
from inferplane.gateway.lora import AdapterRoute
from inferplane.gateway.tracing import TracingConfig
from inferplane.planner.plan import Plan
from inferplane.spec import FleetSpec, ModelSpec
from inferplane.spec.gateway import GatewayTimeouts

# A fleet `routing.policy` is a preset chain of scorers; least-outstanding breaks ties.
POLICY_SCORERS: dict[str, tuple[str, ...]] = {
    "least_outstanding": ("least_outstanding",),
    "engine_metrics": ("engine_metrics", "least_outstanding"),
    "prefix_affinity": ("prefix_affinity", "least_outstanding"),
    "session_affinity": ("session_affinity", "least_outstanding"),
}


def _timeouts(model: ModelSpec, defaults: GatewayTimeouts) -> Timeouts:
    own = model.timeouts
    return Timeouts(
        connect_s=(own and own.connect_s) or defaults.connect_s,
        first_token_s=(own and own.first_byte_s) or defaults.first_byte_s,
        idle_s=(own and own.idle_s) or defaults.idle_s,
        total_s=(own and own.total_s) or defaults.total_s,
    )


# Without a plan (endpoint models, unplanned simulated fleets): vLLM's long-standing default
# max_num_seqs. With one, each replica's cap is what the plan starts its engine with.
UNPLANNED_CONCURRENCY_PER_REPLICA = 256


def model_route(
    model: ModelSpec, defaults: GatewayTimeouts, planned_seqs: int | None = None
) -> ModelRoute:
    cap = model.max_tokens_cap
    lane = model.routing.long_prompt
    return ModelRoute(
        name=model.name,
        endpoints=tuple(model.endpoints or ()),
        served_name=model.engine_model_name if model.engine_model_name != model.name else None,
        aliases=tuple(model.aliases),
        task=model.task,
        scorers=POLICY_SCORERS[model.routing.policy],
        session_header=model.routing.session_header,
        max_concurrency_per_replica=(
            planned_seqs or model.max_num_seqs or UNPLANNED_CONCURRENCY_PER_REPLICA
        ),
        max_tokens_cap=cap.limit if cap is not None else None,
        max_tokens_mode=cap.action if cap is not None else "clamp",
        long_prompt_lane=LongPromptLane(lane.threshold_tokens, lane.model)
        if lane is not None
        else None,
        timeouts=_timeouts(model, defaults),
        retries=model.routing.retries,
        eject_after_failures=model.routing.eject_after_failures,
        eject_after_5xx=model.routing.eject_after_5xx,
        max_ejection_percent=model.routing.max_ejection_percent,
        admission=Admission(
            max_queue_depth=model.routing.max_queue_depth,
            max_queue_wait_s=model.routing.max_queue_wait_s,
        ),
        adapters=tuple(
            AdapterRoute(a.name, model.name, a.source, tuple(a.aliases))
            for a in (model.lora.adapters if model.lora is not None else ())
        ),
        adapter_cache_slots=model.lora.cpu_slots if model.lora is not None else 1,
    )


def gateway_config_from_fleet(fleet: FleetSpec, plan: Plan | None = None) -> GatewayConfig:
    """Models with `endpoints:` get static backends; placed models start with none and
    receive theirs from the runtime via `GatewayState.set_backends`. With the `plan`, each
    model's per-replica concurrency cap is the max_num_seqs its engines start with."""
    gw = fleet.gateway
    seqs: dict[str, int] = {}
    for inst in plan.instances if plan is not None else []:
        seqs[inst.model] = max(seqs.get(inst.model, 0), inst.max_num_seqs)
    return GatewayConfig(
        models=tuple(model_route(m, gw.timeouts, seqs.get(m.name)) for m in fleet.models),
        routes=tuple(
            WeightedRoute(
                r.model, tuple(WeightedTarget(b.target, float(b.weight)) for b in r.backends)
            )
            for r in fleet.routes
        ),
        host=gw.host,
        port=gw.port,
        max_body_bytes=int(gw.max_body_mib * 2**20),
        access_log_path=gw.access_log_path,
        priority_header=gw.priority_header,
        connections=ConnectionLimits(**gw.connections.model_dump()),
        metrics_token=os.environ.get(gw.metrics_token_env) if gw.metrics_token_env else None,
        console_allowed_hosts=tuple(gw.console_allowed_hosts),
        expose_replica_header=gw.expose_replica_header,
        server=gw.server,
        tracing=TracingConfig(
            otlp_endpoint=gw.tracing.otlp_endpoint, service_name=gw.tracing.service_name,
            sample_ratio=gw.tracing.sample_ratio,
        ) if gw.tracing is not None else None,
    )
