"""`scaling:` — replica autoscaling on queue length, not CPU (P46, P50)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from inferplane.spec.base import SpecModel
from inferplane.spec.problems import Issue, issues_error
from inferplane.spec.types import Fraction, NonNegativeInt, PositiveFloat, PositiveInt


class ScalingPolicy(SpecModel):
    """When to add or remove replicas. Defaults follow P50: up fast, down slowly."""

    target_waiting_requests: PositiveInt = 5  # vllm:num_requests_waiting per replica
    target_kv_cache_usage: Fraction | None = None  # also scale when KV usage stays above this
    scale_up_window_s: PositiveFloat = 120.0  # its mean over this window decides an add
    scale_down_window_s: PositiveFloat = 600.0  # idle this long before removing one
    stabilization_s: PositiveFloat = 300.0  # no opposite move within this time
    # SLA mode (docs/scaling.md): also scale to the replicas a performance model says these
    # latency targets need at the observed request mix, before the queue builds.
    target_ttft_p95_s: PositiveFloat | None = None
    target_itl_p95_s: PositiveFloat | None = None

    @property
    def sla_mode(self) -> bool:
        return self.target_ttft_p95_s is not None or self.target_itl_p95_s is not None


class SleepPolicy(SpecModel):
    """Put replicas to sleep (vLLM sleep mode) instead of stopping them (docs/scaling.md).

    Level 1 offloads the weights to host RAM and discards the KV cache: waking copies them
    back (seconds), but every sleeping replica holds its weights in host RAM. Level 2
    discards the weights too: waking reloads them from disk (slower, no host RAM held).
    Both keep the process, its CUDA context and compiled graphs, so either wakes far
    faster than a cold start.
    """

    level: Literal[1, 2] = 1


class ModelScaling(SpecModel):
    """Replica bounds for one model. A floor of 1 avoids minutes of cold start (P28)."""

    min_replicas: NonNegativeInt = 1
    max_replicas: PositiveInt
    policy: ScalingPolicy | None = None  # None: scaling.policy
    # Scale down by sleeping (the process stays; the GPU memory is freed) and wake first
    # when scaling up; a sleeping or idle replica yields its GPU to a model that needs it.
    sleep: SleepPolicy | None = None

    @model_validator(mode="after")
    def _bounds(self) -> ModelScaling:
        if self.min_replicas > self.max_replicas:
            raise issues_error(
                [
                    Issue(
                        ("min_replicas",),
                        f"min_replicas is above max_replicas ({self.max_replicas})",
                        self.min_replicas,
                        "make min_replicas <= max_replicas",
                    )
                ]
            )
        return self


class ScalingSpec(SpecModel):
    """A default policy plus per-model bounds; models not listed keep a fixed replica count."""

    policy: ScalingPolicy = Field(default_factory=ScalingPolicy)
    models: dict[str, ModelScaling] = Field(default_factory=dict)

    def policy_for(self, model: str) -> ScalingPolicy:
        bounds = self.models.get(model)
        return bounds.policy if bounds and bounds.policy else self.policy
