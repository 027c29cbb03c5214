"""`engine:` — which inference engine serves the placed models, and which version."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, StrictStr, model_validator

from inferplane.engines.vllm.versions import DEFAULT_VLLM_VERSION
from inferplane.spec.base import SpecModel
from inferplane.spec.types import EnvMap, Version

EngineKind = Literal["vllm", "sim"]

__all__ = ["DEFAULT_VLLM_VERSION", "EngineKind", "EngineSpec"]


class EngineSpec(SpecModel):
    """`engine: vllm` | `engine: sim` | `{kind, version, image, extra_env}`."""

    kind: EngineKind = "vllm"
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
