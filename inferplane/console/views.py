"""The console's data, as JSON-ready dicts: fleet map, models, an instance's logs, usage.

Pure functions of what the runtime, the gateway and the sampler hold; the HTML pages and
the `/ui/api/*` endpoints both render these, so the browser tests' DOM attributes and the
JSON agree by construction.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from inferplane.console.source import FleetSource
from inferplane.gpus import GIB
from inferplane.runtime.labels import gpus_label

if TYPE_CHECKING:
    from inferplane.console.sampler import Sampler
    from inferplane.gateway.app import GatewayApp
    from inferplane.gateway.backend import Backend
    from inferplane.planner.plan import (
        InstanceMemory,
        Plan,
        PlanCpuNode,
        PlanGpu,
        PlanInstance,
    )

MAX_LOG_LINES = 500


def _memory_on(inst: PlanInstance, gpu: PlanGpu) -> InstanceMemory:
    """The instance's per-GPU memory on `gpu` (its pipeline stage's when it spans nodes)."""
    for rank in inst.ranks:
        if rank.node == gpu.node and gpu.index in rank.gpu_indices and rank.memory:
            return rank.memory
    return inst.memory


def card_shares(plan: Plan, gpu: PlanGpu) -> list[dict[str, Any]]:
    """Each instance's share of one card as the planner counts `used_gib`: its
    utilization x the card, plus its CUDA context (and CUDA graphs where the vLLM release
    keeps them outside the budget), split into weights / KV pool / overhead."""
    from inferplane.engines.vllm.versions import era_of

    graphs_outside = era_of(plan.engine_version) != "v1new"
    by_id = {i.id: i for i in plan.instances}
    out = []
    for iid in gpu.instances:
        inst = by_id.get(iid)
        if inst is None:
            continue
        mem = _memory_on(inst, gpu)
        share = inst.gpu_memory_utilization * gpu.memory_gib + mem.cuda_context_gib
        if graphs_outside:
            share += mem.cuda_graph_gib
        overhead = max(share - mem.weights_gib - mem.kv_cache_gib, 0.0)
        out.append({
            "id": iid, "model": inst.model,
            "share_gib": round(share, 3), "weights_gib": round(mem.weights_gib, 3),
            "kv_cache_gib": round(mem.kv_cache_gib, 3), "overhead_gib": round(overhead, 3),
            "kv_cache_tokens": mem.kv_cache_tokens,
        })  # fmt: skip
    return out


def host_shares(plan: Plan, host: PlanCpuNode) -> list[dict[str, Any]]:
    """Each CPU engine's share of its host's RAM as the planner counts `used_gib` (weights
    + KV cache + the engine processes' runtime) and the cores it binds."""
    by_id = {i.id: i for i in plan.instances}
    out = []
    for iid in host.instances:
        inst = by_id.get(iid)
        if inst is None:
            continue
        mem = inst.memory
        share = (inst.host_memory_bytes or 0) / GIB
        out.append({
            "id": iid, "model": inst.model, "cores": list(inst.cpu_cores),
            "share_gib": round(share, 3), "weights_gib": round(mem.weights_gib, 3),
            "kv_cache_gib": round(mem.kv_cache_gib, 3),
            "overhead_gib": round(max(share - mem.weights_gib - mem.kv_cache_gib, 0.0), 3),
            "kv_cache_tokens": mem.kv_cache_tokens,
        })  # fmt: skip
    return out


def fleet_view(
    source: FleetSource | None, sampler: Sampler | None, now: float | None = None
) -> dict[str, Any]:
    """nodes -> GPUs -> instances with the plan's memory split and the live reading."""
    if source is None:
        message = "this gateway runs without `inferplane up`: no fleet to map"
        return {"plan": False, "nodes": [], "unplaced": [], "message": message}
    now = time.time() if now is None else now
    status = source.status()
    states = {i["name"]: i for i in status.get("instances", [])}
    live = sampler.live if sampler is not None else {}

    def instance_state(iid: str) -> dict[str, Any]:
        rec = states.get(iid, {})
        reading = live.get(iid)
        return {
            "state": _state(rec) if rec else "not running",
            "restarts": rec.get("restarts", 0),
            "live": None if reading is None else {
                "kv_cache_usage": reading["kv_cache_usage"], "waiting": reading["waiting"],
                "running": reading["running"], "age_s": round(now - reading["at"], 1),
            },
        }  # fmt: skip

    plan = source.plan
    if plan is None:
        return {
            "plan": False, "nodes": [],
            "unplaced": [{"id": n, "model": i["model"], **instance_state(n)}
                         for n, i in states.items()],
            "message": "the fleet lists no GPUs (gpus:), so nothing was planned per card",
        }  # fmt: skip
    nodes: dict[str, list[dict[str, Any]]] = {}
    for gpu in plan.gpus:
        shares = card_shares(plan, gpu)
        for share in shares:
            share.update(instance_state(share["id"]))
        nodes.setdefault(gpu.node, []).append({
            "index": gpu.index, "uuid": gpu.uuid, "type": gpu.type,
            "memory_gib": gpu.memory_gib, "budget_gib": gpu.budget_gib,
            "used_gib": gpu.used_gib, "free_gib": gpu.free_gib, "instances": shares,
        })  # fmt: skip
    hosts: dict[str, list[dict[str, Any]]] = {}
    for host in plan.cpus:  # a CPU plan (engine device cpu): cores and RAM, no cards
        shares = host_shares(plan, host)
        for share in shares:
            share.update(instance_state(share["id"]))
        hosts.setdefault(host.node, []).append({
            "cores": list(host.cores), "memory_gib": host.memory_gib,
            "budget_gib": host.budget_gib, "used_gib": host.used_gib,
            "free_gib": host.free_gib, "instances": shares,
        })  # fmt: skip
    placed = {i for g in plan.gpus for i in g.instances} | {
        i for h in plan.cpus for i in h.instances}
    names = list(dict.fromkeys([*nodes, *hosts]))
    return {
        "plan": True, "device": plan.device,
        "engine": plan.engine, "engine_version": plan.engine_version,
        "nodes": [{"name": n, "gpus": nodes.get(n, []), "cpus": hosts.get(n, [])}
                  for n in names],
        "unplaced": [{"id": n, "model": i["model"], **instance_state(n)}
                     for n, i in states.items() if n not in placed],
    }  # fmt: skip


def _state(rec: dict[str, Any]) -> str:
    """The state a person reads: the supervisor's, or asleep / draining from the runtime."""
    if rec.get("sleep_level"):
        return "sleeping"
    if rec.get("scaling") == "draining":
        return "draining"
    state = str(rec.get("state", "unknown"))
    return "loading" if state == "starting" else state


def models_view(gateway: GatewayApp, source: FleetSource | None) -> dict[str, Any]:
    """Every model: its replicas (state, restarts, routable, LoRA adapters held), its routes
    and weights."""
    status = source.status() if source is not None else {}
    by_model: dict[str, list[dict[str, Any]]] = {}
    for inst in status.get("instances", []):
        by_model.setdefault(inst["model"], []).append({
            "name": inst["name"], "state": _state(inst), "restarts": inst["restarts"],
            "pid": inst.get("pid"), "port": inst.get("port"), "gpus": inst.get("gpus") or [],
            "gpus_label": gpus_label(inst, status.get("instances", [])),
            "url": inst.get("url"), "last_error": inst.get("last_error"),
        })  # fmt: skip
    routable = {b.url: b for pool in gateway.state.pools.values() for b in pool.backends}
    held = gateway.adapters.table()  # replica URL -> adapters its /v1/models lists
    models = []
    for name, pool in gateway.state.pools.items():
        route = pool.route
        replicas = by_model.get(name)
        if replicas is None:  # endpoints or a gateway without a runtime: its backends
            replicas = [{"name": b.label, "state": _endpoint_state(b), "restarts": None,
                         "url": b.url} for b in pool.backends]  # fmt: skip
        for rep in replicas:
            b = routable.get(str(rep.get("url") or "").rstrip("/"))
            rep["routable"] = b is not None and b.ready and not b.ejected
            rep["in_flight"] = b.outstanding if b is not None else 0
            rep["adapters"] = held.get(str(rep.get("url") or "").rstrip("/"), [])
        models.append({
            "name": name, "aliases": list(route.aliases), "served_name": route.upstream_name,
            "endpoints": list(route.endpoints), "queue_depth": len(pool.queue),
            "adapters": [a.name for a in route.adapters], "replicas": replicas,
        })  # fmt: skip
    return {"models": models, "routes": routes_view(gateway)}


def _endpoint_state(b: Backend) -> str:
    """An endpoint nothing supervises is "external" (as `inferplane status` says), not
    "ready": the gateway only learns it is down from failed requests (then "ejected")."""
    if b.ejected:
        return "ejected"
    return "external" if b.ready else "not ready"


def routes_view(gateway: GatewayApp) -> list[dict[str, Any]]:
    """Weighted routes (canaries) as the gateway applies them now, DB overrides included."""
    out = []
    for name, chooser in sorted(gateway.state._weighted.items()):
        total = chooser.total or 1.0
        out.append({
            "name": name,
            "targets": [{"model": m, "weight": w, "share": round(w / total, 4)}
                        for m, w in zip(chooser.names, chooser.weights, strict=True)],
        })  # fmt: skip
    return out


def logs_view(
    source: FleetSource | None, sampler: Sampler | None, name: str, lines: int
) -> dict[str, Any]:
    """An instance's last log lines, its state changes and scaling events."""
    from inferplane.errors import InferplaneError
    from inferplane.runtime.logs import read_tail
    from inferplane.scaling.events import read_events

    if source is None:
        raise InferplaneError("no fleet runtime: instance logs need `inferplane up`",
                              field="instance", value=name)  # fmt: skip
    known = [i["name"] for i in source.status().get("instances", [])]
    if name not in known:
        raise InferplaneError("no such instance in this fleet", field="instance", value=name,
                              fix=f"instances: {', '.join(known) or '(none)'}")  # fmt: skip
    if not 1 <= lines <= MAX_LOG_LINES:
        raise InferplaneError("lines must be between 1 and 500", field="lines", value=lines,
                              fix="e.g. ?lines=100")  # fmt: skip
    path = source.state_dir.log_dir / f"{name}.log"
    try:
        text = read_tail(path, lines).decode("utf-8", errors="replace")
    except FileNotFoundError:
        text = ""
    changes = list(sampler.events.get(name, ())) if sampler is not None else []
    scaling = [e for e in read_events(source.state_dir.path) if e.get("instance") == name]
    return {"instance": name, "log": str(path), "lines": text.splitlines(),
            "state_changes": changes, "scaling_events": scaling[-50:]}  # fmt: skip
