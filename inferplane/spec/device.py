"""Checks that tie `engine.device` to the inventory, the models and the autoscaler.

A CPU fleet (`engine: {kind: vllm, device: cpu}`) runs on CPU nodes only (`{name,
cpu_cores, host_memory_gib}`, or the discovered host), one process per replica with no
tensor or pipeline parallelism, and has no sleep mode (the autoscaler stops and starts
replicas). A GPU fleet has no CPU nodes and no `cpu_cores`. Locs are from the fleet's root.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from inferplane.spec.problems import Issue

if TYPE_CHECKING:
    from inferplane.spec.fleet import FleetSpec

_CPU_NODE_FIX = "declare CPU nodes as {name: NAME, cpu_cores: N, host_memory_gib: G}"


def device_issues(fleet: FleetSpec) -> list[Issue]:
    return _cpu_issues(fleet) if fleet.engine.device == "cpu" else _cuda_issues(fleet)


def _cuda_issues(fleet: FleetSpec) -> list[Issue]:
    issues: list[Issue] = []
    for index, node in enumerate(fleet.gpus.nodes if fleet.gpus else []):
        if node.is_cpu:
            issues.append(Issue(
                ("gpus", "nodes", index, "cpu_cores"),
                "a CPU node in a GPU fleet (engine device gpu)", node.cpu_cores,
                "set engine: {kind: vllm, device: cpu} to serve on CPU cores, or give the "
                "node gpu_type and count",
            ))
    for index, model in enumerate(fleet.models):
        if model.cpu_cores is not None:
            issues.append(Issue(
                ("models", index, "cpu_cores"), "cpu_cores is for engine device cpu",
                model.cpu_cores, "remove it, or set engine: {kind: vllm, device: cpu}",
            ))
    return issues


def _cpu_issues(fleet: FleetSpec) -> list[Issue]:
    issues: list[Issue] = []
    for index, node in enumerate(fleet.gpus.nodes if fleet.gpus else []):
        if not node.is_cpu:
            issues.append(Issue(
                ("gpus", "nodes", index, "gpu_type"),
                "engine device cpu serves on CPU cores, this node lists GPUs", node.gpu_type,
                f"{_CPU_NODE_FIX}, or use engine device gpu for GPU nodes",
            ))
    for index, model in enumerate(fleet.models):
        if model.is_endpoint:
            continue
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            value = getattr(model, name)
            if isinstance(value, int) and value > 1:
                issues.append(Issue(
                    ("models", index, name),
                    "a CPU replica is one process on its own cores (no tensor or pipeline "
                    "parallelism here)", value,
                    f"remove {name}; give the replica more cores with cpu_cores",
                ))
        if model.placement.gpu_type is not None:
            issues.append(Issue(
                ("models", index, "placement", "gpu_type"), "a CPU fleet has no GPU types",
                model.placement.gpu_type, "remove placement.gpu_type (placement.node picks "
                "a CPU node)",
            ))
        if model.gpu_memory_utilization != "auto":
            issues.append(Issue(
                ("models", index, "gpu_memory_utilization"),
                "a CPU replica's memory is its weights plus an explicit KV cache",
                model.gpu_memory_utilization,
                "remove it; size the KV cache with kv_cache_memory_gib",
            ))
    for name, bounds in fleet.scaling.models.items():
        if bounds.sleep is not None:
            issues.append(Issue(
                ("scaling", "models", name, "sleep"),
                "vLLM has no sleep mode on CPU", bounds.sleep.level,
                "remove sleep: the autoscaler stops idle CPU replicas and starts them again",
            ))
    return issues
