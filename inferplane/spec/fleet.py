"""`FleetSpec`: the whole fleet file."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field, model_validator

from inferplane.spec.base import SpecModel
from inferplane.spec.device import device_issues
from inferplane.spec.engine import EngineSpec
from inferplane.spec.gateway import GatewaySpec, GatewayTimeouts
from inferplane.spec.inventory import GpuInventory, parse_gpus_field
from inferplane.spec.lora_checks import lora_file_issues
from inferplane.spec.model import ModelSpec
from inferplane.spec.planning import PlanningSpec
from inferplane.spec.problems import issues_error
from inferplane.spec.references import reference_issues
from inferplane.spec.scaling import ScalingSpec
from inferplane.spec.traffic import LimitsSpec, RouteSpec


class FleetSpec(SpecModel):
    """Everything inferplane plans, runs, routes and deploys. Only `models` is required."""

    engine: EngineSpec = Field(default_factory=EngineSpec)
    # None means "discover": read the GPUs of the host (or cluster) at run time.
    gpus: Annotated[GpuInventory | None, BeforeValidator(parse_gpus_field)] = None
    models: list[ModelSpec] = Field(min_length=1)
    gateway: GatewaySpec = Field(default_factory=GatewaySpec)
    routes: list[RouteSpec] = Field(default_factory=list)
    limits: LimitsSpec = Field(default_factory=LimitsSpec)
    scaling: ScalingSpec = Field(default_factory=ScalingSpec)
    planning: PlanningSpec = Field(default_factory=PlanningSpec)

    @model_validator(mode="after")
    def _start_from_zero(self) -> FleetSpec:
        """A model scaled with `min_replicas: 0` and no `replicas` of its own starts at 0:
        it takes no room until a request arrives (scale from zero, docs/scaling.md)."""
        for model in self.models:
            bounds = self.scaling.models.get(model.name)
            if bounds is not None and bounds.min_replicas == 0 and (
                    "replicas" not in model.model_fields_set):
                model.replicas = 0
        return self

    @model_validator(mode="after")
    def _references(self) -> FleetSpec:
        issues = reference_issues(self) + device_issues(self) + lora_file_issues(self)
        if issues:
            raise issues_error(issues)
        return self

    # --- lookups shared by the planner, gateway and deployers ------------------------------

    @property
    def discover_gpus(self) -> bool:
        """Whether planning needs this host's GPUs: `gpus: discover` and something to place
        (a fleet of `endpoints:` models plans and renders without NVML; a CPU fleet reads
        the host's cores and RAM instead, planner/cpu.py)."""
        return (self.gpus is None and self.engine.device == "gpu"
                and any(m.replicas > 0 for m in self.placed_models))

    @property
    def on_cpu(self) -> bool:
        """Engines on the host's CPU cores (`engine: {kind: vllm, device: cpu}`)."""
        return self.engine.device == "cpu"

    @property
    def placed_models(self) -> list[ModelSpec]:
        """Models inferplane runs on its GPUs (those with a source)."""
        return [model for model in self.models if not model.is_endpoint]

    @property
    def endpoint_models(self) -> list[ModelSpec]:
        """Models served elsewhere: routed to, never placed."""
        return [model for model in self.models if model.is_endpoint]

    def model(self, name: str) -> ModelSpec | None:
        """The model a client-facing name (a model name or an alias) refers to."""
        for model in self.models:
            if name == model.name or name in model.aliases:
                return model
        return None

    def timeouts_for(self, name: str) -> GatewayTimeouts:
        """The model's timeouts, each unset field falling back to `gateway.timeouts`."""
        defaults = self.gateway.timeouts
        model = self.model(name)
        if model is None or model.timeouts is None:
            return defaults
        overrides: dict[str, Any] = model.timeouts.model_dump(exclude_none=True)
        return defaults.model_copy(update=overrides)
