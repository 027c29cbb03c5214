"""The GPU memory estimator: what vLLM will find at startup, computed before anything starts.

Follows vLLM v1's accounting (Worker.determine_available_memory + kv_cache_utils):

    requested   = ceil(total x gpu_memory_utilization)
    available   = requested - weights - activation peak - non-torch - CUDA graphs (>= 0.21)
    num_blocks  = available // (page_bytes x group_size)
    concurrency = num_blocks / blocks one request at max_model_len needs

Pure functions: no I/O, no clock. See docs/estimator.md for the rules and their sources.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferplane.engines.vllm.defaults import default_batch_limits
from inferplane.engines.vllm.versions import (
    DEFAULT_VLLM_VERSION,
    default_gpu_memory_utilization,
    era_of,
    parse_version,
)
from inferplane.errors import InferplaneError
from inferplane.estimator import lora as lora_memory
from inferplane.estimator import overheads, rules
from inferplane.estimator.kv_cache import (
    DEFAULT_BLOCK_SIZE,
    MLA_BLOCK_SIZE_HOPPER,
    KvLayout,
    kv_dtype_bytes,
    kv_layout,
    max_model_len_that_fits,
)
from inferplane.estimator.pipeline import Stage, stage_profile, stages
from inferplane.estimator.types import EngineSettings, MemoryEstimate, RankMemory
from inferplane.estimator.weights import (
    DTYPE_BYTES,
    resolve_dtype,
    resolve_quantization,
    stage_weight_bytes,
    weight_format,
)
from inferplane.gpus.spec import GIB, GpuSpec
from inferplane.models.profile import ModelProfile

AUTO_MAX_MODEL_LEN = -1

# V0 turns chunked prefill on by itself for long contexts (`EngineArgs.create_engine_config`:
# `max_model_len > 32768`, on CUDA, without sliding window, speculative decoding or LoRA,
# for generation models) and then batches its chunked-prefill default instead of a whole
# max_model_len prompt: 512 tokens, 2048 from v0.6.5 on (vLLM PR 10544).
V0_LONG_CONTEXT_TOKENS = 32768
V0_CHUNKED_PREFILL_TOKENS = 2048
V0_CHUNKED_PREFILL_TOKENS_BEFORE_0_6_5 = 512


def _gib(value: float) -> float:
    return round(value / GIB, 4)


def _block_size(profile: ModelProfile, settings: EngineSettings, gpu: GpuSpec | None) -> int:
    if settings.block_size:
        return settings.block_size
    if profile.uses_mla and (gpu is None or gpu.compute_capability >= (9, 0)):
        return MLA_BLOCK_SIZE_HOPPER
    return DEFAULT_BLOCK_SIZE


def _kv_tokens(
    layout: KvLayout, num_blocks: int, concurrency: float, max_len: int, era: str
) -> int:
    """'GPU KV cache size: N tokens' as each vLLM era prints it."""
    if era == "v1new":
        return int(concurrency * max_len)
    if era == "v1mid":
        return num_blocks // max(1, len(layout.groups)) * layout.block_size
    return num_blocks * layout.block_size


@dataclass(frozen=True)
class _Length:
    """The max_model_len vLLM will run with (before an auto-fit), and what was said about it."""

    value: int
    auto: bool
    errors: list[str]
    warnings: list[str]


def _check_inputs(
    settings: EngineSettings, gpu: GpuSpec | None, gpu_memory_bytes: int | None
) -> int:
    """Raise for input that cannot be estimated at all; return the card's total bytes."""
    if gpu_memory_bytes is not None:
        total = gpu_memory_bytes
    elif gpu is not None:
        total = gpu.total_memory_bytes
    else:
        raise InferplaneError(
            "no GPU given", field="gpu", fix="pass a GPU name (--gpu) or --gpu-memory-gib"
        )
    if not 0 < settings.gpu_memory_utilization <= 1:
        raise InferplaneError(
            "must be in (0, 1]", field="gpu_memory_utilization",
            value=settings.gpu_memory_utilization,
            fix="use a fraction of the whole card such as 0.9",
        )
    if settings.tensor_parallel_size < 1:
        raise InferplaneError(
            "must be >= 1", field="tensor_parallel_size", value=settings.tensor_parallel_size,
            fix="use 1, 2, 4 or 8",
        )
    if settings.pipeline_parallel_size < 1:
        raise InferplaneError(
            "must be >= 1", field="pipeline_parallel_size",
            value=settings.pipeline_parallel_size, fix="use 1 (one node) or the number of nodes",
        )
    return total


def _resolve_length(profile: ModelProfile, requested: int | None) -> _Length:
    """max_model_len: explicit, the model's default (P02 warning), or auto-fit later (-1)."""
    model_max = profile.max_position_embeddings
    auto = requested == AUTO_MAX_MODEL_LEN
    value = model_max if requested is None or auto else requested
    if value < 1:
        raise InferplaneError(
            "must be a positive number of tokens or auto", field="max_model_len",
            value=requested, fix="e.g. --max-model-len 8192",
        )
    errors: list[str] = []
    warnings: list[str] = []
    if requested is None:
        warnings.append(
            f"P02: max_model_len not set, vLLM will use the model's {model_max} tokens; "
            "set it explicitly to what your traffic needs"
        )
    if value > model_max:
        errors.append(
            f"max_model_len {value} exceeds the model's maximum of {model_max} tokens "
            "(vLLM refuses without VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)"
        )
    return _Length(value, auto, errors, warnings)


def _settings_messages(
    profile: ModelProfile,
    settings: EngineSettings,
    dtype: str,
    quantization: str | None,
    gpu: GpuSpec | None,
) -> tuple[list[str], list[str]]:
    """(errors, warnings) about TP, dtype/quantization, FP8 support and KV dtype."""
    tp = settings.tensor_parallel_size
    errors = rules.tensor_parallel_errors(profile, tp)
    errors += rules.quantization_dtype_errors(
        quantization, dtype, settings.quantization is not None, gpu
    )
    fp8_errors, warnings = rules.fp8_support_messages(quantization, settings.kv_cache_dtype, gpu)
    errors += fp8_errors
    checkpoint_kv = profile.quantization.kv_cache_dtype if profile.quantization else None
    if settings.kv_cache_dtype == "auto" and checkpoint_kv:
        warnings.append(
            f"the checkpoint ships {checkpoint_kv} KV-cache scales; "
            f"--kv-cache-dtype {checkpoint_kv} would double the KV capacity"
        )
    if tp > profile.num_kv_heads and not profile.uses_mla:
        warnings.append(
            f"tensor_parallel_size {tp} > {profile.num_kv_heads} KV heads: every rank keeps a "
            "replicated copy of a KV head"
        )
    if settings.enforce_eager:
        warnings.append(
            "P33: enforce_eager disables CUDA graphs: decode latency rises several-fold "
            "(TTFT 85 -> 620 ms in the field); use only as a last resort"
        )
    return errors, warnings


def v0_enables_chunked_prefill(
    profile: ModelProfile, settings: EngineSettings, max_len: int, era: str
) -> bool:
    """True when the V0 engine switches chunked prefill on by itself (the user set no batch
    budget, the context is longer than 32K, and nothing V0 excludes is in use)."""
    return (
        era == "v0"
        and settings.max_num_batched_tokens is None
        and max_len > V0_LONG_CONTEXT_TOKENS
        and profile.default_task == "generate"
        and profile.sliding_window is None
        and "sliding" not in profile.layer_attention
    )


def v0_chunked_prefill_tokens(version: str) -> int:
    """V0's max_num_batched_tokens default once chunked prefill is on."""
    if parse_version(version) < (0, 6, 5):
        return V0_CHUNKED_PREFILL_TOKENS_BEFORE_0_6_5
    return V0_CHUNKED_PREFILL_TOKENS


@dataclass
class _StageMemory:
    """What one pipeline stage (the whole model when PP is 1) holds on each of its GPUs."""

    stage: Stage
    weights: int
    activation: int
    non_torch: int
    cuda_graph: int
    available: int
    layout: KvLayout
    lora: int = 0  # LoRA adapter slots

    @property
    def avail_bytes(self) -> int:
        return max(0, self.available)

    @property
    def num_blocks(self) -> int:
        return self.layout.num_blocks(self.avail_bytes) if self.layout.page_bytes else 0


def _stage_list(profile: ModelProfile, settings: EngineSettings) -> list[Stage]:
    pp = settings.pipeline_parallel_size
    if pp == 1 and settings.pipeline_layer_partition is None:
        return [Stage(0, 1, 0, profile.num_layers)]
    return stages(profile.num_layers, pp, settings.pipeline_layer_partition)


def estimate_memory(
    profile: ModelProfile,
    settings: EngineSettings,
    *,
    gpu: GpuSpec | None = None,
    gpu_memory_bytes: int | None = None,
) -> MemoryEstimate:
    """Per-GPU memory of one vLLM instance serving `profile` with `settings`.

    Give either `gpu` (a catalog entry) or `gpu_memory_bytes` (total as CUDA reports it).
    Problems vLLM would refuse are returned in `errors` (and `fits` is False); only input
    that cannot be estimated at all raises InferplaneError.

    With `pipeline_parallel_size` > 1 every stage is estimated on its own layers (see
    `inferplane.estimator.pipeline`); vLLM gives every stage the smallest stage's number of
    KV blocks, so the replica's KV tokens and concurrency are that stage's, and the
    per-GPU figures reported are of that stage (`worst_rank`); `ranks` has all of them.
    """
    total = _check_inputs(settings, gpu, gpu_memory_bytes)
    version = settings.vllm_version or DEFAULT_VLLM_VERSION
    era = era_of(version)
    tp = settings.tensor_parallel_size
    pp = settings.pipeline_parallel_size
    util = settings.gpu_memory_utilization
    stage_list = _stage_list(profile, settings)

    dtype = resolve_dtype(profile, settings.dtype)
    quantization = resolve_quantization(profile, settings.quantization)
    errors, warnings = _settings_messages(profile, settings, dtype, quantization, gpu)
    warnings = list(profile.warnings) + warnings
    length = _resolve_length(profile, settings.max_model_len)
    errors += length.errors
    warnings += length.warnings
    max_len = length.value

    default_seqs, default_tokens = default_batch_limits(
        total, gpu.name if gpu else None, max_len, era
    )
    if v0_enables_chunked_prefill(profile, settings, max_len, era):
        default_tokens = v0_chunked_prefill_tokens(version)
        warnings.append(
            f"vLLM {version} (V0) turns chunked prefill on by itself for max_model_len "
            f"{max_len} > {V0_LONG_CONTEXT_TOKENS} and batches {default_tokens} tokens per step"
        )
    max_num_seqs = settings.max_num_seqs or default_seqs
    max_num_batched_tokens = settings.max_num_batched_tokens or default_tokens

    # Everything inside the utilization budget that is not KV cache, per stage.
    fmt = weight_format(profile, dtype, quantization)
    graph_in_budget = era == "v1new"
    requested = math.ceil(total * util)
    kv_bytes = kv_dtype_bytes(settings.kv_cache_dtype, DTYPE_BYTES[dtype])
    block_size = _block_size(profile, settings, gpu)
    parts: list[_StageMemory] = []
    for stage in stage_list:
        part_profile = stage_profile(profile, stage)
        weights = stage_weight_bytes(profile, fmt, tp, part_profile)
        activation = overheads.activation_peak_bytes(
            part_profile, tp, DTYPE_BYTES[dtype], max_num_batched_tokens, max_num_seqs,
            profile.default_task == "generate" and stage.is_last, era, version,
        )
        non_torch = overheads.non_torch_bytes(tp, era, pp)
        lora_bytes = 0
        if settings.lora is not None:
            modules = lora_memory.wrapped_modules(
                profile, tp, num_layers=stage.num_layers, first_stage=stage.is_first,
                last_stage=stage.is_last,
            )
            lora_bytes = lora_memory.reservation_bytes(modules, settings.lora, DTYPE_BYTES[dtype])
            activation += lora_memory.shrink_buffer_bytes(
                modules, settings.lora, max_num_batched_tokens)
        cuda_graph = 0 if settings.enforce_eager else overheads.cuda_graph_bytes(
            part_profile, max_num_seqs, version
        )
        if settings.kv_cache_memory_bytes is not None:
            available = settings.kv_cache_memory_bytes  # vLLM skips profiling entirely
        else:
            available = requested - weights.per_gpu_bytes - lora_bytes - activation - non_torch
            if graph_in_budget:
                available -= cuda_graph
        where = f" (pipeline stage {stage.rank})" if pp > 1 else ""
        if weights.per_gpu_bytes + lora_bytes > requested:
            errors.append(
                f"weights need {_gib(weights.per_gpu_bytes + lora_bytes):.2f} GiB per GPU"
                f"{' (LoRA slots included)' if lora_bytes else ''}{where} but "
                f"gpu_memory_utilization {util} x {_gib(total):.2f} GiB allows "
                f"{_gib(requested):.2f} GiB: raise tensor_parallel_size"
                + (" or pipeline_parallel_size" if pp > 1 else "")
                + ", quantize, or use a larger GPU"
            )
        elif available <= 0:
            errors.append(
                f"no memory left for the KV cache after weights and activations{where}: raise "
                "gpu_memory_utilization, lower max_num_batched_tokens, or raise "
                "tensor_parallel_size"
            )
        layout = kv_layout(part_profile, tp, kv_bytes, block_size)
        parts.append(_StageMemory(stage, weights.per_gpu_bytes, activation, non_torch,
                                  cuda_graph, available, layout, lora_bytes))

    # The KV pool: blocks, the length that fits, concurrency (the tightest stage decides).
    if length.auto:
        max_len = min(
            max_model_len_that_fits(
                part.layout, part.avail_bytes, profile.max_position_embeddings,
                max_num_batched_tokens,
            )
            for part in parts
        )
        if max_len == 0 and not errors:
            errors.append("cannot auto-fit max_model_len: not enough memory for a single token")
    num_blocks = min(part.num_blocks for part in parts)
    concurrency = min(
        _concurrency(part.layout, num_blocks, max_len, max_num_batched_tokens) for part in parts
    )
    for part in parts:
        layout, available = part.layout, part.available
        needed = layout.bytes_per_request(max_len, max_num_batched_tokens) if layout.groups else 0
        if available > 0 and needed > available and not length.auto:
            fits_len = max_model_len_that_fits(
                layout, part.avail_bytes, max_len, max_num_batched_tokens
            )
            where = f" on pipeline stage {part.stage.rank}" if pp > 1 else ""
            errors.append(
                f"P02: one request at max_model_len {max_len} needs {_gib(needed):.2f} GiB of "
                f"KV cache{where} but only {_gib(available):.2f} GiB is available; the largest "
                f"length that fits is {fits_len}: lower max_model_len, use --kv-cache-dtype "
                "fp8, or raise gpu_memory_utilization / tensor_parallel_size"
            )
    warnings += rules.utilization_warnings(
        util, fmt.quantized_bytes_per_param <= 1.01 and fmt.quantization is not None,
        profile.params.total,
        default_gpu_memory_utilization(settings.vllm_version or DEFAULT_VLLM_VERSION),
    )
    if concurrency and concurrency < 1 <= max_num_seqs and not errors:
        warnings.append(f"P09: fewer than one request fits at {max_len} tokens")

    worst = min(parts, key=lambda part: (part.num_blocks, -part.weights, part.stage.rank))
    full_layout = worst.layout if pp == 1 else kv_layout(profile, tp, kv_bytes, block_size)
    return MemoryEstimate(
        total_memory_gib=_gib(total),
        requested_memory_gib=_gib(requested),
        weights_gib=_gib(worst.weights),
        activation_gib=_gib(worst.activation),
        non_torch_gib=_gib(worst.non_torch),
        cuda_graph_gib=_gib(worst.cuda_graph),
        cuda_graph_in_budget=graph_in_budget,
        cuda_context_gib=_gib(overheads.CUDA_CONTEXT_BYTES),
        kv_cache_gib=_gib(worst.avail_bytes),
        kv_bytes_per_token=full_layout.bytes_per_token_total,
        kv_bytes_per_token_per_gpu=worst.layout.bytes_per_token_per_gpu,
        block_size=worst.layout.block_size,
        num_gpu_blocks=num_blocks,
        kv_cache_tokens=_kv_tokens(worst.layout, num_blocks, concurrency, max_len, era),
        max_model_len=max_len,
        max_concurrency=round(concurrency, 2),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        tensor_parallel_size=tp,
        gpu_memory_utilization=util,
        dtype=dtype,
        kv_cache_dtype=settings.kv_cache_dtype,
        quantization=quantization,
        vllm_version=version,
        fits=not errors,
        warnings=warnings,
        errors=errors,
        pipeline_parallel_size=pp,
        worst_rank=worst.stage.rank,
        ranks=[_rank_memory(part) for part in parts] if pp > 1 else [],
        lora_gib=_gib(worst.lora),
    )


def _concurrency(
    layout: KvLayout, num_blocks: int, max_len: int, max_num_batched_tokens: int
) -> float:
    per_request = layout.blocks_per_request(max_len, max_num_batched_tokens) if layout.groups \
        else 0
    return num_blocks / per_request if per_request else 0.0


def _rank_memory(part: _StageMemory) -> RankMemory:
    return RankMemory(
        rank=part.stage.rank,
        start_layer=part.stage.start_layer,
        end_layer=part.stage.end_layer,
        weights_gib=_gib(part.weights),
        activation_gib=_gib(part.activation),
        non_torch_gib=_gib(part.non_torch),
        cuda_graph_gib=_gib(part.cuda_graph),
        kv_cache_gib=_gib(part.avail_bytes),
        lora_gib=_gib(part.lora),
        num_gpu_blocks=part.num_blocks,
        kv_bytes_per_token_per_gpu=part.layout.bytes_per_token_per_gpu,
    )
