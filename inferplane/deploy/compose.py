"""docker compose: one file per node, one service per plan instance, plus the gateway.

Docker hands a container exactly the GPUs in `device_ids` (UUIDs when the plan knows
them), renumbered from 0, so co-located services simply name the same card and
`CUDA_VISIBLE_DEVICES` is rewritten to container-local indices (P20, P21). Start order
comes from `depends_on: condition: service_healthy` (S0: embedding first).

A compose project is one host: a plan with replicas that span nodes is refused, as are the
Kubernetes-only options (see `hosts`). `--weights prewarm` (P35): a one-shot `prewarm-<model>`
service per model copies the weights to `prewarm_dir` on the host (the same idempotent copy
as the Kubernetes DaemonSet); engines wait for it to complete and mount the local copy
read-only where the source was, so their start period counts local-disk reads only.
"""

from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path
from typing import Any

from inferplane.deploy import hosts
from inferplane.deploy.checks import CheckProblem
from inferplane.deploy.k8s.engine import engine_argv, shm_gib
from inferplane.deploy.k8s.weights import (
    HF_CACHE_MOUNT,
    PREWARM_MOUNT,
    SOURCE_MOUNT,
    copy_script,
    hub_dir,
    local_name,
)
from inferplane.deploy.names import object_name
from inferplane.deploy.options import RenderOptions, engine_image
from inferplane.deploy.yamlio import dump_docs, load_docs
from inferplane.engines import engine_for
from inferplane.planner.plan import Plan, PlanInstance
from inferplane.spec import FleetSpec

HEADER = "# Rendered by `inferplane render --target compose`; edit the fleet file instead.\n"
GATEWAY_SERVICE = "gateway"


def _health(port: int, path: str) -> list[str]:
    code = f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}{path}', " \
           "timeout=5)"
    return ["CMD", "python3", "-c", code]


def _duration(seconds: float) -> str:
    return f"{math.ceil(seconds)}s"


def engine_service(
    fleet: FleetSpec, plan: Plan, inst: PlanInstance, options: RenderOptions
) -> dict[str, Any]:
    from inferplane.deploy.k8s.context import K8sContext

    ctx = K8sContext(fleet, plan, options)
    engine = fleet.engine
    devices = list(inst.gpu_uuids) if inst.gpu_uuids else [str(i) for i in inst.gpu_indices]
    env = dict(inst.env)
    if not inst.cpu_cores:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(inst.tensor_parallel_size))
    model = fleet.model(inst.model)
    volumes: list[str] = []
    prewarmed = options.weights == "prewarm" and model is not None and bool(model.source)
    if model is not None and model.source:
        local = f"{options.prewarm_dir.rstrip('/')}/{local_name(inst.model)}"
        if model.source.startswith("/"):
            volumes.append(f"{local if prewarmed else model.source}:{model.source}:ro")
        elif prewarmed:
            hub = f"hub/{hub_dir(model.source)}"
            volumes.append(f"{local}/{hub}:{HF_CACHE_MOUNT}/{hub}:ro")
            env.update({"HF_HOME": HF_CACHE_MOUNT, "HF_HUB_OFFLINE": "1"})
        else:
            volumes.append("hf-cache:/root/.cache/huggingface")
    if model is not None and model.lora is not None:  # each adapter at its own path
        volumes += [f"{a.source}:{a.source}:ro" for a in model.lora.adapters]
    service: dict[str, Any] = {
        "image": engine_image(engine.kind, engine.version, engine.image, options,
                              engine.device),
        "entrypoint": engine_argv(ctx, inst)[:1],
        "command": engine_argv(ctx, inst)[1:],
        "environment": dict(sorted(env.items())),
        "ports": [f"{inst.port}:{inst.port}"],
        "shm_size": f"{shm_gib(inst.tensor_parallel_size)}gb",
        "ulimits": {"nofile": {"soft": options.nofile, "hard": options.nofile}},  # P30
        "restart": "unless-stopped",
        "stop_signal": "SIGTERM",
        "stop_grace_period": _duration(options.drain_s + options.grace_margin_s),  # P27
        "healthcheck": {
            "test": _health(inst.port, engine_for(engine.kind).endpoints.models),
            "interval": "10s",
            "timeout": "5s",
            "retries": 3,
            "start_period": _duration(  # P24, from local disk when pre-warmed (P35)
                options.startup_budget_s(inst.weights_bytes, local=prewarmed)),
        },
        "deploy": {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "device_ids": devices, "capabilities": ["gpu"]}
        ]}}},
        "labels": {"io.inferplane.instance": inst.id, "io.inferplane.model": inst.model},
    }
    if inst.cpu_cores:  # a CPU engine: its cores and RAM, no GPU device
        from inferplane.engines.vllm import cpu as vllm_cpu

        del service["deploy"]
        service.update(vllm_cpu.compose_settings(inst.cpu_cores, inst.host_memory_bytes))
    if volumes:
        service["volumes"] = volumes
    deps = [d for d in inst.start_after if any(i.id == d and i.node == inst.node
                                               for i in plan.instances)]
    depends: dict[str, dict[str, str]] = {
        object_name(d): {"condition": "service_healthy"} for d in sorted(deps)}
    if prewarmed:
        depends[prewarm_service_name(inst.model)] = {
            "condition": "service_completed_successfully"}
    if depends:
        service["depends_on"] = depends
    return service


def prewarm_service_name(model: str) -> str:
    return object_name(f"prewarm-{model}")


def prewarm_service(fleet: FleetSpec, plan: Plan, model: str,
                    options: RenderOptions) -> dict[str, Any]:
    """Copies one model's weights to the host's local disk once (P35), then exits 0."""
    from inferplane.deploy.k8s.context import K8sContext

    spec = fleet.model(model)
    assert spec is not None and spec.source
    engine = fleet.engine
    volumes = [f"{options.prewarm_dir.rstrip('/')}:{PREWARM_MOUNT}"]
    if spec.source.startswith("/"):
        volumes.append(f"{spec.source}:{SOURCE_MOUNT}:ro")
    # `$$`: compose would read `$(cat ...)` as its own variable interpolation and refuse it.
    script = copy_script(K8sContext(fleet, plan, options), model).replace("$", "$$")
    return {
        "image": engine_image(engine.kind, engine.version, engine.image, options,
                              engine.device),
        "entrypoint": ["/bin/sh", "-c", script],
        "volumes": volumes,
        "restart": "no",
        "labels": {"io.inferplane.prewarm": model},
    }


def render_compose(
    fleet: FleetSpec, plan: Plan, options: RenderOptions, fleet_text: str
) -> dict[str, str]:
    hosts.refuse_spanning(plan, "compose")
    hosts.refuse_cluster_options(fleet, plan, options, "compose")
    nodes = hosts.nodes_in_order(plan)
    gateway_node = nodes[0]
    files: dict[str, str] = {}
    for node in nodes:
        services: dict[str, Any] = {}
        uses_hf = False
        for inst in plan.instances:
            if inst.node != node:
                continue
            services[object_name(inst.id)] = engine_service(fleet, plan, inst, options)
            uses_hf = uses_hf or any(v.startswith("hf-cache:") for v in
                                     services[object_name(inst.id)].get("volumes", []))
            spec = fleet.model(inst.model)
            if options.weights == "prewarm" and spec is not None and spec.source:
                services[prewarm_service_name(inst.model)] = prewarm_service(
                    fleet, plan, inst.model, options)
        if node == gateway_node:
            services[GATEWAY_SERVICE] = gateway_service(fleet, plan, node, options)
            files[f"{object_name(node)}/fleet.yaml"] = fleet_text
        # The project name is the directory's: the node name.
        doc: dict[str, Any] = {"services": services}
        if uses_hf:
            doc["volumes"] = {"hf-cache": {}}
        files[f"{object_name(node)}/compose.yaml"] = HEADER + dump_docs([doc])
    return files


def gateway_service(
    fleet: FleetSpec, plan: Plan, node: str, options: RenderOptions
) -> dict[str, Any]:
    port = fleet.gateway.port
    command = ["gateway", "--fleet", "/etc/inferplane/fleet.yaml", "--host", "0.0.0.0",
               "--port", str(port)]
    local: list[str] = []
    for inst in plan.instances:
        host = object_name(inst.id) if inst.node == node else hosts.host_of(fleet, inst.node)
        command += ["--backend", f"{inst.model}=http://{host}:{inst.port}"]
        if inst.node == node:
            local.append(object_name(inst.id))
    return {
        "image": options.gateway_image,
        "entrypoint": ["inferplane"],
        "command": command,
        "ports": [f"{port}:{port}"],
        "volumes": ["./fleet.yaml:/etc/inferplane/fleet.yaml:ro"],
        "ulimits": {"nofile": {"soft": options.nofile, "hard": options.nofile}},
        "restart": "unless-stopped",
        "stop_grace_period": _duration(options.prestop_sleep_s + options.drain_s),
        "healthcheck": {"test": _health(port, "/health"), "interval": "10s", "timeout": "5s",
                        "retries": 3, "start_period": "30s"},
        "depends_on": {name: {"condition": "service_started"} for name in sorted(local)},
    }


def compose_schema() -> dict[str, Any]:
    text = resources.files("inferplane.deploy").joinpath("schemas/compose-spec.json").read_text(
        encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def check_compose_file(path: Path, root: Path) -> list[CheckProblem]:
    import jsonschema

    rel = str(path.relative_to(root))
    docs = load_docs(path.read_text(encoding="utf-8"))
    if len(docs) != 1:
        return [CheckProblem(rel, "", "expected exactly one YAML document")]
    validator = jsonschema.Draft7Validator(compose_schema())
    problems = [
        CheckProblem(rel, ".".join(str(p) for p in err.absolute_path) or "compose",
                     err.message)
        for err in sorted(validator.iter_errors(docs[0]), key=lambda e: list(e.absolute_path))
    ]
    services = docs[0].get("services") or {}
    for name, svc in sorted(services.items()):
        for dep in svc.get("depends_on") or {}:
            if dep not in services:
                problems.append(CheckProblem(rel, f"services.{name}",
                                             f"depends_on {dep!r} is not a service here"))
        for vol in svc.get("volumes") or []:
            src = str(vol).split(":", 1)[0]
            if src.startswith("./") and not (path.parent / src).exists():
                problems.append(CheckProblem(rel, f"services.{name}", f"{src} is missing"))
    return problems
