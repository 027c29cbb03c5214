"""Weight memory per GPU, the way vLLM's "Model loading took X GiB" counts it.

Each parameter role (see `ParamCounts`) has its own dtype rule: weight-only quantization
touches projection and expert weights, never embeddings, norms or the LM head (P07), and a
MoE model loads every expert (P04). Tensor parallelism shards projections, experts and the
vocabulary; norms, and MLA's low-rank down-projections, are replicated on every rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from inferplane.errors import InferplaneError
from inferplane.models.profile import ModelProfile

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

# vLLM pads the vocabulary of embedding and LM head to a multiple of this per rank.
VOCAB_PADDING = 64

# Canonical quantization family of each vLLM `--quantization` value.
QUANT_FAMILY = {
    "fp8": "fp8",
    "modelopt": "fp8",
    "fbgemm_fp8": "fp8",
    "awq": "awq",
    "awq_marlin": "awq",
    "gptq": "gptq",
    "gptq_marlin": "gptq",
    "compressed-tensors": "compressed-tensors",
    "mxfp4": "mxfp4",
    "bitsandbytes": "bitsandbytes",
}


@dataclass(frozen=True)
class WeightFormat:
    """How weights are stored once loaded."""

    dtype: str  # activation / unquantized weight dtype
    quantization: str | None  # effective vLLM method name, None for unquantized
    quantized_bytes_per_param: float  # for roles the method quantizes
    quantizes_linear: bool
    quantizes_experts: bool


@dataclass(frozen=True)
class WeightBreakdown:
    total_bytes: int  # whole model, before TP sharding
    per_gpu_bytes: int  # one TP rank
    source: str  # "safetensors" (exact file sizes) or "config" (from the architecture)


def resolve_dtype(profile: ModelProfile, requested: str) -> str:
    """vLLM's dtype choice: 'auto' keeps the checkpoint dtype, but serves float32 as bf16."""
    if requested in ("auto", "", None):
        checkpoint = profile.torch_dtype or "bfloat16"
        return "bfloat16" if checkpoint == "float32" else checkpoint
    if requested in ("half",):
        return "float16"
    if requested not in DTYPE_BYTES:
        raise InferplaneError(
            "unknown dtype",
            field="dtype",
            value=requested,
            fix="use auto, bfloat16, float16 or float32",
        )
    return requested


def resolve_quantization(profile: ModelProfile, requested: str | None) -> str | None:
    """The method vLLM will use: the checkpoint's, unless the user asks for a compatible one."""
    checkpoint = profile.quantization.method if profile.quantization else None
    if requested is None:
        return checkpoint
    if requested not in QUANT_FAMILY:
        raise InferplaneError(
            "unknown quantization method",
            field="quantization",
            value=requested,
            fix=f"use one of {', '.join(sorted(QUANT_FAMILY))}, or omit it",
        )
    if checkpoint and QUANT_FAMILY.get(checkpoint, checkpoint) != QUANT_FAMILY[requested]:
        raise InferplaneError(
            f"the checkpoint is quantized with {checkpoint}, vLLM refuses a different method",
            field="quantization",
            value=requested,
            fix=f"omit --quantization (vLLM reads {checkpoint} from the checkpoint)",
        )
    return requested


def weight_format(profile: ModelProfile, dtype: str, quantization: str | None) -> WeightFormat:
    dtype_bytes = DTYPE_BYTES[dtype]
    if quantization is None:
        return WeightFormat(dtype, None, dtype_bytes, False, False)
    family = QUANT_FAMILY.get(quantization, quantization)
    info = profile.quantization
    bits = info.weight_bits if info else (8 if family == "fp8" else 4)
    group = info.group_size if info and info.group_size else None
    if family == "fp8":
        per_param = 1.0
        if group:  # block-wise fp32 scales, one per group x group tile
            per_param += 4 / (group * group)
    elif family in ("awq", "gptq"):
        g = group or 128
        # packed int weights + one fp16 scale and one packed zero point per group
        per_param = bits / 8 + (2 + bits / 8) / g
    elif family == "mxfp4":
        per_param = 0.5 + 1 / 32  # 4-bit values, one e8m0 scale per 32
    elif family == "bitsandbytes":
        per_param = 0.5 + 4 / 64  # nf4 values, one fp32 absmax per 64
    else:  # compressed-tensors and anything else with a bit width
        per_param = bits / 8 + (2 / group if group else 0)
    # gpt-oss style mxfp4 checkpoints quantize only the experts.
    experts_only = family == "mxfp4"
    return WeightFormat(dtype, quantization, per_param, not experts_only, True)


def _padded_vocab_per_rank(vocab: int, tp: int) -> int:
    padded = math.ceil(vocab / VOCAB_PADDING) * VOCAB_PADDING
    return math.ceil(padded / tp)


def _replicated_linear_params(profile: ModelProfile, tp: int) -> int:
    """Projection parameters every rank holds in full, beyond its 1/tp share."""
    if tp == 1:
        return 0
    replicated = 0
    if profile.uses_mla:
        # MLA's down-projections (q_a, kv_a with the rope part) are ReplicatedLinear.
        down = (profile.q_lora_rank or 0) + (profile.kv_lora_rank or 0)
        down += profile.qk_rope_head_dim or 0
        replicated += profile.num_layers * profile.hidden_size * down
    elif tp > profile.num_kv_heads:
        # K and V heads are replicated when there are fewer of them than ranks.
        kv_proj = 2 * profile.hidden_size * profile.head_dim * profile.num_layers
        replicated += kv_proj * (tp - profile.num_kv_heads) // profile.num_kv_heads
    return replicated


def _expert_padding(profile: ModelProfile, fmt: WeightFormat, tp: int) -> float:
    """vLLM's MXFP4 MoE kernels pad expert matrices: hidden to 256, intermediate to 128."""
    if fmt.quantization is None or QUANT_FAMILY.get(fmt.quantization) != "mxfp4":
        return 1.0
    inter = profile.moe_intermediate_size // tp or 1
    hidden = profile.hidden_size
    padded = math.ceil(hidden / 256) * 256 * math.ceil(inter / 128) * 128
    return padded / (hidden * inter)


def expert_bytes_per_gpu(profile: ModelProfile, fmt: WeightFormat, tp: int) -> float:
    """Bytes of all routed experts on one TP rank (vLLM shards every expert over TP)."""
    rate = fmt.quantized_bytes_per_param if fmt.quantizes_experts else DTYPE_BYTES[fmt.dtype]
    return profile.params.experts / tp * rate * _expert_padding(profile, fmt, tp)


def _rope_cache_bytes(profile: ModelProfile, dtype_bytes: int) -> int:
    """RotaryEmbedding keeps a cos/sin table of max_position x rotary_dim in the model dtype."""
    rotary_dim = (profile.qk_rope_head_dim or 0) if profile.uses_mla else profile.head_dim
    return profile.max_position_embeddings * rotary_dim * dtype_bytes


def weight_bytes(profile: ModelProfile, fmt: WeightFormat, tp: int) -> WeightBreakdown:
    """Total and per-rank weight bytes for `profile` stored as `fmt`, sharded over `tp` ranks."""
    p = profile.params
    dtype_bytes = DTYPE_BYTES[fmt.dtype]
    linear_rate = fmt.quantized_bytes_per_param if fmt.quantizes_linear else dtype_bytes
    expert_rate = fmt.quantized_bytes_per_param if fmt.quantizes_experts else dtype_bytes

    total = (
        (p.embedding + p.lm_head + p.other) * dtype_bytes
        + p.linear * linear_rate
        + p.experts * expert_rate
    )

    # Vocab-parallel embedding and LM head: 1/tp of the padded vocabulary each.
    vocab_padding = _padded_vocab_per_rank(profile.vocab_size, tp) * tp / profile.vocab_size
    embedding_rank = (p.embedding + p.lm_head) * dtype_bytes / tp * vocab_padding
    linear_rank = (p.linear / tp + _replicated_linear_params(profile, tp)) * linear_rate
    per_gpu = (
        embedding_rank
        + linear_rank
        + p.experts / tp * expert_rate * _expert_padding(profile, fmt, tp)
        + p.other * dtype_bytes
        + _rope_cache_bytes(profile, dtype_bytes)
    )

    same_format = (
        fmt.dtype == resolve_dtype(profile, "auto")
        and profile.torch_dtype != "float32"
        and fmt.quantization == (profile.quantization.method if profile.quantization else None)
    )
    loaded = profile.weight_bytes_loaded or profile.weight_bytes_on_disk
    if loaded and profile.params_source == "safetensors" and same_format:
        # Real file sizes beat our per-dtype arithmetic; keep the computed sharding ratio.
        scale = loaded / total
        return WeightBreakdown(
            loaded, int(per_gpu * scale), "safetensors"
        )
    return WeightBreakdown(int(total), int(per_gpu), "config")


def stage_weight_bytes(
    profile: ModelProfile, fmt: WeightFormat, tp: int, stage: ModelProfile
) -> WeightBreakdown:
    """Weights of one pipeline stage (`inferplane.estimator.pipeline.stage_profile`) per GPU;
    `total_bytes` stays the whole model's. With real file sizes the stage keeps the model's
    file-size / arithmetic ratio. `stage is profile` (one stage) is `weight_bytes` itself."""
    full = weight_bytes(profile, fmt, tp)
    if stage is profile:
        return full
    part = weight_bytes(stage, fmt, tp)
    if full.source != "safetensors":
        return WeightBreakdown(full.total_bytes, part.per_gpu_bytes, "config")
    computed = weight_bytes(
        replace(profile, weight_bytes_on_disk=None, weight_bytes_loaded=None,
                params_source="config"),
        fmt, tp,
    )
    scale = full.total_bytes / computed.total_bytes if computed.total_bytes else 1.0
    return WeightBreakdown(full.total_bytes, int(part.per_gpu_bytes * scale), "safetensors")
