"""How `status` and the console name an instance's GPUs (no heavy imports: `status`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def gpus_label(inst: Mapping[str, Any], instances: Sequence[Mapping[str, Any]]) -> str:
    """`4,5,6,7`, or with the node first when the instances run on several nodes
    (`node-b:4,5,6,7`): GPUs 4-7 of two nodes are not the same cards. A CPU engine
    shows the cores it binds (`cpu 0-1`)."""
    if inst.get("cpus"):
        from inferplane.engines.vllm.cpu import threads_bind

        return "cpu " + threads_bind(inst["cpus"])
    gpus = ",".join(str(g) for g in inst.get("gpus") or []) or "-"
    nodes = {i.get("node") for i in instances if i.get("node")}
    return f"{inst['node']}:{gpus}" if len(nodes) > 1 and inst.get("node") else gpus
