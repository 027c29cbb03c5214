"""`engine:` — which inference engine serves the placed models, and which version."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, StrictStr, model_validator

from inferplane.engines.vllm.versions import DEFAULT_VLLM_VERSION
from inferplane.spec.base import SpecModel
from inferplane.spec.problems import Issue, issues_error
from inferplane.spec.types import EnvMap, Version

EngineKind = Literal["vllm", "sim"]
# Where the engine runs: NVIDIA GPUs (`gpu`, the registry's default), or the host's CPU
# cores and RAM (vLLM's CPU build, docs/runtime.md#real-vllm-on-cpu). With `kind`, the key
# of the engine registry (`inferplane.engines.engine_for(kind, device)`).
EngineDevice = Literal["gpu", "cpu"]

__all__ = ["DEFAULT_VLLM_VERSION", "EngineDevice", "EngineKind", "EngineSpec"]


class EngineSpec(SpecModel):
    """`engine: vllm` | `engine: sim` | `{kind, device, version, image, extra_env}`."""

    kind: EngineKind = "vllm"
    device: EngineDevice = "gpu"
    version: Version = DEFAULT_VLLM_VERSION  # vLLM version; flags are validated against it
    image: StrictStr | None = Field(default=None, min_length=1)  # container image for deploys
    extra_env: EnvMap = Field(default_factory=dict)  # set on every engine process

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        # `engine: sim` is the same as `engine: {kind: sim}`.
        if isinstance(data, str):
            return {"kind": data}
        return data

    @model_validator(mode="after")
    def _device(self) -> EngineSpec:
        if self.device == "cpu" and self.kind != "vllm":
            raise issues_error([Issue(
                ("device",), f"device: cpu runs the vLLM CPU build; engine {self.kind} has "
                "no device", self.device,
                "use engine: {kind: vllm, device: cpu}, or drop device",
            )])
        return self
