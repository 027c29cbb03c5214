"""A discovered pod's cap from the plan: the max_num_seqs of the plan instance it runs.

The renderer writes the instance ids a pod runs into its `inferplane.io/instances`
annotation (one id, or a co-located set); the instance of the discovered model among them
gives the cap. Which number wins when the pod's own `--max-num-seqs` says otherwise: the
smaller. The plan is the sizing the KV budget was computed for, and the pod's flag is what
its engine really enforces; the two differ only while a rollout replaces pods rendered
from an older plan, or after a hand edit, and in both cases the smaller one neither sends
an engine more than it runs nor more than the plan sized.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferplane.deploy.names import ANNOTATION_INSTANCES
from inferplane.planner.plan import Plan


class PlannedCaps:
    """`by_id`: plan instance id -> (its model, its max_num_seqs)."""

    def __init__(self, by_id: Mapping[str, tuple[str, int]]) -> None:
        self._by_id = dict(by_id)

    @classmethod
    def from_plan(cls, plan: Plan) -> PlannedCaps:
        return cls({inst.id: (inst.model, inst.max_num_seqs) for inst in plan.instances})

    def cap(self, pod: Any, model: str) -> int | None:
        """`pod` is a `V1Pod`; None when the pod names no instance of `model` in the plan
        (a hand-written manifest, a plan from before the pod)."""
        notes = (pod.metadata.annotations if pod.metadata is not None else None) or {}
        for inst_id in str(notes.get(ANNOTATION_INSTANCES, "")).split(","):
            planned = self._by_id.get(inst_id.strip())
            if planned is not None and planned[0] == model:
                return planned[1]
        return None


def combined(planned: int | None, own: int | None) -> int | None:
    """The plan's cap and the pod's own flag: the smaller when both say one (see above)."""
    if planned is None or own is None:
        return planned if own is None else own
    return min(planned, own)
