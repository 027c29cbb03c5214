"""PodDisruptionBudgets: one per workload, never per model.

A co-located pod serves two models; two PDBs matching one pod make the eviction API refuse
it outright, so node drains would hang. One PDB per Deployment keeps drains working while
allowing one pod at a time to go (the same one-at-a-time as the rollout, P26).
"""

from __future__ import annotations

from typing import Any

from inferplane.deploy.k8s.context import K8sContext, Workload


def pdb(ctx: K8sContext, workload: Workload) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": ctx.metadata(workload.name, "engine"),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": ctx.selector(workload)},
        },
    }
