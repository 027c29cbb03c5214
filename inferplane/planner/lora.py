"""A model's `lora:` block for the planner: the engine's LoRA arguments (flags, adapters
loaded at start) and the slots the estimator reserves memory for."""

from __future__ import annotations

from inferplane.engines.vllm.lora import LoraArgs, LoraModule
from inferplane.estimator.lora import LoraSlots, reservation_bytes, wrapped_modules
from inferplane.estimator.weights import DTYPE_BYTES
from inferplane.models.profile import ModelProfile
from inferplane.spec.model import ModelSpec


def lora_slots(model: ModelSpec) -> LoraSlots | None:
    if model.lora is None:
        return None
    return LoraSlots(max_loras=model.lora.max_loras, max_lora_rank=model.lora.max_lora_rank)


def host_lora_bytes(model: ModelSpec, profile: ModelProfile, dtype: str) -> int:
    """What a CPU engine's slots take in host memory (the same tensors, in RAM)."""
    slots = lora_slots(model)
    if slots is None:
        return 0
    return reservation_bytes(wrapped_modules(profile, 1), slots, DTYPE_BYTES[dtype])


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
