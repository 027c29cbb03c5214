"""A fleet's headline numbers, for `validate` and anything else that prints a fleet."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from inferplane.spec.fleet import FleetSpec


@dataclass(frozen=True)
class FleetSummary:
    engine: str  # "vllm 0.11.0" or "sim"
    models: int
    placed_models: int
    endpoint_models: int
    replicas: int  # placed replicas requested (before autoscaling)
    endpoints: int
    gpus: int | None  # None: discovered at run time
    nodes: int | None
    device: str = "gpu"  # cpu: `gpus` counts CPU cores

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        unit = "CPU core" if self.device == "cpu" else "GPU"
        if self.gpus is None or self.nodes is None:
            gpus = f"{unit}s: discover"
        else:
            gpus = f"{_count(self.gpus, unit)} on {_count(self.nodes, 'node')}"
        return (
            f"{_count(self.models, 'model')} "
            f"({self.placed_models} placed, {self.endpoint_models} endpoint-only), "
            f"{_count(self.replicas, 'replica')}, {_count(self.endpoints, 'endpoint')}, "
            f"{gpus}, engine {self.engine}"
        )


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'s' * (number != 1)}"


def summarize(fleet: FleetSpec) -> FleetSummary:
    engine = fleet.engine.kind if fleet.engine.kind == "sim" else f"vllm {fleet.engine.version}"
    if fleet.on_cpu:
        engine += " on CPU"
    return FleetSummary(
        engine=engine,
        models=len(fleet.models),
        placed_models=len(fleet.placed_models),
        endpoint_models=len(fleet.endpoint_models),
        replicas=sum(model.replicas for model in fleet.placed_models),
        endpoints=sum(len(model.endpoints or ()) for model in fleet.endpoint_models),
        gpus=None if fleet.gpus is None else fleet.gpus.total_gpus,
        nodes=None if fleet.gpus is None else len(fleet.gpus.nodes),
        device=fleet.engine.device,
    )
