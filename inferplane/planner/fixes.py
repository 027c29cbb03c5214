"""Suggested fixes for a refused fleet, each one checked by planning again with it applied.

A `Fix` is the sentence printed to the user and the change to the fleet it describes; the
planner prints only the fixes whose changed fleet plans (`verified`), so every number in
them - a replica count, a length, GPUs to add on a named node - is one it accepts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inferplane.errors import InferplaneError
from inferplane.spec import FleetSpec, ModelSpec
from inferplane.spec.inventory import NodeSpec

# At most this many re-plans per refusal, each with a short solver limit: a refusal stays
# quick even for a large fleet.
MAX_CHECKED = 8
CHECK_TIME_LIMIT_S = 1.0


@dataclass(frozen=True)
class Fix:
    text: str
    apply: Callable[[FleetSpec], FleetSpec]


class PlanRefused(InferplaneError):
    """The fleet does not fit; `fixes` are the suggestions printed, each of which plans."""

    def __init__(self, message: str, *, field: str, value: object, fixes: list[Fix],
                 fallback: str) -> None:
        self.fixes = fixes
        super().__init__(message, field=field, value=value,
                         fix="; or ".join(f.text for f in fixes) if fixes else fallback)


def with_model(name: str, **changes: Any) -> Callable[[FleetSpec], FleetSpec]:
    """The fleet with model `name`'s fields changed (`placement` takes a dict of hints)."""
    def apply(fleet: FleetSpec) -> FleetSpec:
        models: list[ModelSpec] = []
        for model in fleet.models:
            if model.name == name:
                update = dict(changes)
                if "placement" in update:
                    update["placement"] = model.placement.model_copy(update=update["placement"])
                model = model.model_copy(update=update)
            models.append(model)
        return fleet.model_copy(update={"models": models})

    return apply


def without_model(name: str) -> Callable[[FleetSpec], FleetSpec]:
    def apply(fleet: FleetSpec) -> FleetSpec:
        return fleet.model_copy(update={"models": [m for m in fleet.models if m.name != name]})

    return apply


def with_node(name: str, **changes: Any) -> Callable[[FleetSpec], FleetSpec]:
    """The fleet with inventory node `name` changed (more GPUs, another type)."""
    def apply(fleet: FleetSpec) -> FleetSpec:
        assert fleet.gpus is not None
        nodes = [n.model_copy(update=changes) if n.name == name else n for n in fleet.gpus.nodes]
        return fleet.model_copy(update={"gpus": fleet.gpus.model_copy(update={"nodes": nodes})})

    return apply


def with_new_node(node: NodeSpec) -> Callable[[FleetSpec], FleetSpec]:
    def apply(fleet: FleetSpec) -> FleetSpec:
        assert fleet.gpus is not None
        nodes = [*fleet.gpus.nodes, node]
        return fleet.model_copy(update={"gpus": fleet.gpus.model_copy(update={"nodes": nodes})})

    return apply


def verified(
    fleet: FleetSpec, fixes: list[Fix], plans: Callable[[FleetSpec], object]
) -> list[Fix]:
    """The fixes whose changed fleet `plans` (raising InferplaneError when it does not), in
    order, without duplicate texts."""
    out: list[Fix] = []
    for fix in fixes[:MAX_CHECKED]:
        if any(f.text == fix.text for f in out):
            continue
        try:
            plans(fix.apply(fleet))
        except InferplaneError:
            continue
        out.append(fix)
    return out
