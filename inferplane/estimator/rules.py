"""Validation rules that vLLM enforces at startup (or that bite later), each with its P-id."""

from __future__ import annotations

from inferplane.gpus.spec import GpuSpec
from inferplane.models.profile import ModelProfile


def valid_tp_sizes(profile: ModelProfile, limit: int = 64) -> list[int]:
    """TP sizes vLLM accepts: dividing the attention heads, and the KV heads evenly
    (or a multiple of them, so each rank gets a replicated KV head)."""
    sizes = []
    for tp in range(1, limit + 1):
        if profile.num_attention_heads % tp:
            continue
        kv = profile.num_kv_heads
        if not profile.uses_mla and kv % tp and tp % kv:
            continue
        sizes.append(tp)
    return sizes


def tensor_parallel_errors(profile: ModelProfile, tp: int) -> list[str]:
    if tp < 1:
        return [f"tensor_parallel_size must be >= 1, got {tp}"]
    if tp in valid_tp_sizes(profile, limit=max(tp, 64)):
        return []
    valid = ", ".join(str(s) for s in valid_tp_sizes(profile))
    return [
        f"P11: tensor_parallel_size {tp} does not divide the model's "
        f"{profile.num_attention_heads} attention heads / {profile.num_kv_heads} KV heads; "
        f"valid sizes: {valid}"
    ]


def pipeline_parallel_errors(
    profile: ModelProfile, pp: int, partition: tuple[int, ...] | None = None
) -> list[str]:
    """vLLM gives every pipeline stage at least one decoder layer (`get_pp_indices`); an
    explicit VLLM_PP_LAYER_PARTITION must have one positive count per stage summing to the
    layers."""
    layers = profile.num_layers
    if pp < 1:
        return [f"pipeline_parallel_size must be >= 1, got {pp}"]
    if pp > layers:
        return [
            f"pipeline_parallel_size {pp} exceeds the model's {layers} decoder layers: a "
            f"stage would hold none; use at most {layers}"
        ]
    if partition is not None and (
        len(partition) != pp or sum(partition) != layers or min(partition) < 1
    ):
        return [
            f"VLLM_PP_LAYER_PARTITION {','.join(map(str, partition))} must give {pp} positive "
            f"layer counts summing to the model's {layers} layers"
        ]
    return []


def quantization_dtype_errors(
    quantization: str | None, dtype: str, explicit_quantization: bool, gpu: GpuSpec | None
) -> list[str]:
    """AWQ's own kernels only take float16 (S2). vLLM switches AWQ checkpoints to awq_marlin
    (bf16-capable) by itself on sm80+, so only an explicit `awq` or an older GPU fails."""
    if quantization != "awq" or dtype != "bfloat16":
        return []
    no_marlin = gpu is not None and gpu.compute_capability < (8, 0)
    if explicit_quantization or no_marlin:
        return [
            "AWQ quantization is not supported with bfloat16 (S2): use --dtype float16"
            + ("" if no_marlin else ", or drop --quantization awq so vLLM uses awq_marlin")
        ]
    return []


def fp8_support_messages(
    quantization: str | None, kv_cache_dtype: str, gpu: GpuSpec | None
) -> tuple[list[str], list[str]]:
    """(errors, warnings) for FP8 weights on GPUs without FP8 tensor cores."""
    errors: list[str] = []
    warnings: list[str] = []
    if gpu is None or quantization not in ("fp8", "modelopt", "fbgemm_fp8"):
        return errors, warnings
    if gpu.compute_capability < (8, 0):
        errors.append(
            f"FP8 weights need compute capability >= 8.0; {gpu.name} is "
            f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}: use a bf16/fp16 or "
            "AWQ/GPTQ checkpoint"
        )
    elif not gpu.supports_fp8:
        warnings.append(
            f"{gpu.name} has no FP8 tensor cores: vLLM runs FP8 weights as weight-only "
            "(Marlin W8A16), slower than on Ada/Hopper"
        )
    return errors, warnings


def utilization_warnings(
    utilization: float, weights_quantized_8bit: bool, total_params: int,
    vllm_default: float | None = None,
) -> list[str]:
    """P06: headroom for activations and fragmentation under real load. vLLM's own
    default (`vllm_default`, 0.92 from 0.21) is not warned about unless the model has a
    reason of its own for a lower band (8-bit weights of 30B+ parameters)."""
    big = total_params >= 30_000_000_000
    safe = 0.85 if (weights_quantized_8bit and big) else 0.90
    if safe == 0.90 and vllm_default is not None and abs(utilization - vllm_default) < 1e-9:
        return []
    if utilization > safe:
        kind = "FP8 models of 30B+" if safe == 0.85 else "this model"
        return [
            f"P06: gpu_memory_utilization {utilization:.2f} is above the safe band for {kind} "
            f"(<= {safe:.2f}); under load activations and fragmentation can still OOM"
        ]
    return []
