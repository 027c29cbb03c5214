"""A model's `lora:` block as the engine's LoRA arguments (flags, adapters loaded at start)."""

from __future__ import annotations

from inferplane.engines.vllm.lora import LoraArgs, LoraModule
from inferplane.spec.model import ModelSpec


def lora_args(model: ModelSpec) -> LoraArgs | None:
    """None without a `lora:` block; every declared adapter is loaded at start (vLLM loads
    `--lora-modules` before it answers), others the gateway loads on demand."""
    lora = model.lora
    if lora is None:
        return None
    return LoraArgs(
        max_loras=lora.max_loras, max_lora_rank=lora.max_lora_rank,
        max_cpu_loras=lora.max_cpu_loras,
        modules=tuple(LoraModule(a.name, a.source) for a in lora.adapters),
    )
