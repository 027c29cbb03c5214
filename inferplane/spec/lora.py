"""`models[].lora:` — fine-tuned LoRA adapters served by one base model's engines.

vLLM serves them from the base's engine (`--enable-lora`); a request names the adapter as
its `model`. The shape here is the contract between the planner (memory), the runtime
(flags, loading), the gateway (routing, tenancy) and the renders. Checks that need the
adapter's files (rank, target modules, base model) live with the code that reads them.
"""

from __future__ import annotations

from pydantic import Field, StrictStr, ValidationInfo, field_validator, model_validator

from inferplane.spec.base import SpecModel
from inferplane.spec.problems import Issue, issues_error
from inferplane.spec.sources import resolve_source
from inferplane.spec.types import PositiveInt

# vLLM's accepted --max-lora-rank values (vllm/config/lora.py, MaxLoRARanks).
VLLM_LORA_RANKS: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class LoraAdapterSpec(SpecModel):
    """One adapter: the client-facing name and a local PEFT directory."""

    name: StrictStr = Field(min_length=1)  # what clients send as "model"
    source: StrictStr = Field(min_length=1)  # adapter_config.json + adapter_model.safetensors
    aliases: list[StrictStr] = Field(default_factory=list)

    @field_validator("source")
    @classmethod
    def _source(cls, value: str, info: ValidationInfo) -> str:
        return resolve_source(value, (info.context or {}).get("base_dir"))

    @property
    def client_names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


class LoraSpec(SpecModel):
    """What the base model's engines reserve for adapters, and the adapters themselves."""

    max_loras: PositiveInt = 1  # adapters in one batch (GPU slots); vLLM's default 1
    max_lora_rank: PositiveInt = 16  # the largest adapter rank; vLLM's default 16
    max_cpu_loras: PositiveInt | None = None  # adapters cached in host memory; None: max_loras
    adapters: list[LoraAdapterSpec] = Field(default_factory=list)

    @field_validator("max_lora_rank")
    @classmethod
    def _rank(cls, value: int) -> int:
        if value in VLLM_LORA_RANKS:
            return value
        above = [r for r in VLLM_LORA_RANKS if r >= value]
        fix = f"use {above[0]}" if above else f"use at most {VLLM_LORA_RANKS[-1]}"
        raise issues_error([Issue(
            (), f"vLLM accepts max_lora_rank only from {list(VLLM_LORA_RANKS)}", value,
            f"{fix} (the smallest accepted rank that holds your adapters)",
        )])

    @model_validator(mode="after")
    def _consistent(self) -> LoraSpec:
        issues: list[Issue] = []
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            issues.append(Issue(
                ("max_cpu_loras",), f"max_cpu_loras is below max_loras ({self.max_loras})",
                self.max_cpu_loras, f"set max_cpu_loras to at least {self.max_loras} or drop it",
            ))
        seen: dict[str, int] = {}
        for index, adapter in enumerate(self.adapters):
            for name in adapter.client_names:
                if name in seen:
                    issues.append(Issue(
                        ("adapters", index, "name"),
                        f"adapter name {name!r} is already used by adapters[{seen[name]}]",
                        name, "give every adapter and alias a unique name",
                    ))
                seen.setdefault(name, index)
        if issues:
            raise issues_error(issues)
        return self

    @property
    def cpu_slots(self) -> int:
        """Adapters kept loaded in host memory (vLLM: max_cpu_loras, default max_loras)."""
        return self.max_cpu_loras if self.max_cpu_loras is not None else self.max_loras
