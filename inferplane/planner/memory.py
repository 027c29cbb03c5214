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

from inferplane.errors import InferplaneError
from inferplane.gpus.spec import GIB, GpuSpec
from inferplane.models.profile import ModelProfile
from inferplane.planner import overheads, rules
from inferplane.planner.defaults import default_batch_limits
from inferplane.planner.estimate_types import EngineSettings, MemoryEstimate
from inferplane.planner.kv_cache import (
    DEFAULT_BLOCK_SIZE,
    MLA_BLOCK_SIZE_HOPPER,
    KvLayout,
    kv_dtype_bytes,
    kv_layout,
    max_model_len_that_fits,
)
from inferplane.planner.vllm_versions import DEFAULT_VLLM_VERSION, era_of
from inferplane.planner.weights import (
    DTYPE_BYTES,
    resolve_dtype,
    resolve_quantization,
    weight_bytes,
    weight_format,
)

AUTO_MAX_MODEL_LEN = -1


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
    """
    if gpu is None and gpu_memory_bytes is None:
        raise InferplaneError(
            "no GPU given", field="gpu", fix="pass a GPU name (--gpu) or --gpu-memory-gib"
        )
    total = gpu_memory_bytes if gpu_memory_bytes is not None else gpu.total_memory_bytes  # type: ignore[union-attr]
    version = settings.vllm_version or DEFAULT_VLLM_VERSION
    era = era_of(version)
    tp = settings.tensor_parallel_size
    util = settings.gpu_memory_utilization
    if not 0 < util <= 1:
        raise InferplaneError(
            "must be in (0, 1]", field="gpu_memory_utilization", value=util,
            fix="use a fraction of the whole card such as 0.9",
        )
    if tp < 1:
        raise InferplaneError(
            "must be >= 1", field="tensor_parallel_size", value=tp, fix="use 1, 2, 4 or 8"
        )
    errors: list[str] = []
    warnings: list[str] = list(profile.warnings)

    dtype = resolve_dtype(profile, settings.dtype)
    quantization = resolve_quantization(profile, settings.quantization)
    kv_dtype = settings.kv_cache_dtype
    if kv_dtype == "auto" and profile.quantization and profile.quantization.kv_cache_dtype:
        warnings.append(
            f"the checkpoint ships {profile.quantization.kv_cache_dtype} KV-cache scales; "
            f"--kv-cache-dtype {profile.quantization.kv_cache_dtype} would double the KV capacity"
        )
    kv_bytes = kv_dtype_bytes(kv_dtype, DTYPE_BYTES[dtype])

    errors += rules.tensor_parallel_errors(profile, tp)
    errors += rules.quantization_dtype_errors(
        quantization, dtype, settings.quantization is not None, gpu
    )
    fp8_errors, fp8_warnings = rules.fp8_support_messages(quantization, kv_dtype, gpu)
    errors += fp8_errors
    warnings += fp8_warnings
    if tp > profile.num_kv_heads and not profile.uses_mla:
        warnings.append(
            f"tensor_parallel_size {tp} > {profile.num_kv_heads} KV heads: every rank keeps a "
            "replicated copy of a KV head"
        )

    # max_model_len: explicit, model default, or auto-fit (-1).
    model_max = profile.max_position_embeddings
    requested_len = settings.max_model_len
    auto_len = requested_len == AUTO_MAX_MODEL_LEN
    max_len = model_max if requested_len is None or auto_len else requested_len
    if max_len < 1:
        raise InferplaneError(
            "must be a positive number of tokens or auto", field="max_model_len",
            value=requested_len, fix="e.g. --max-model-len 8192",
        )
    if requested_len is None:
        warnings.append(
            f"P02: max_model_len not set, vLLM will use the model's {model_max} tokens; "
            "set it explicitly to what your traffic needs"
        )
    if max_len > model_max:
        errors.append(
            f"max_model_len {max_len} exceeds the model's maximum of {model_max} tokens "
            "(vLLM refuses without VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)"
        )

    default_seqs, default_tokens = default_batch_limits(
        total, gpu.name if gpu else None, max_len, era
    )
    max_num_seqs = settings.max_num_seqs or default_seqs
    max_num_batched_tokens = settings.max_num_batched_tokens or default_tokens

    # Weights.
    fmt = weight_format(profile, dtype, quantization)
    weights = weight_bytes(profile, fmt, tp)
    generate = profile.default_task == "generate"

    # Non-KV memory inside the utilization budget.
    activation = overheads.activation_peak_bytes(
        profile, tp, DTYPE_BYTES[dtype], max_num_batched_tokens, max_num_seqs, generate, era
    )
    non_torch = overheads.non_torch_bytes(tp, era)
    cuda_graph = 0 if settings.enforce_eager else overheads.cuda_graph_bytes(
        profile, max_num_seqs, version
    )
    graph_in_budget = era == "v1new"
    requested = math.ceil(total * util)
    if settings.kv_cache_memory_bytes is not None:
        available = settings.kv_cache_memory_bytes  # vLLM skips profiling entirely
    else:
        available = requested - weights.per_gpu_bytes - activation - non_torch
        if graph_in_budget:
            available -= cuda_graph
    if settings.enforce_eager:
        warnings.append(
            "P33: enforce_eager disables CUDA graphs: decode latency rises several-fold "
            "(TTFT 85 -> 620 ms in the field); use only as a last resort"
        )
    if weights.per_gpu_bytes > requested:
        errors.append(
            f"weights need {_gib(weights.per_gpu_bytes):.2f} GiB per GPU but "
            f"gpu_memory_utilization {util} x {_gib(total):.2f} GiB allows "
            f"{_gib(requested):.2f} GiB: raise tensor_parallel_size, quantize, or use a larger GPU"
        )
    elif available <= 0:
        errors.append(
            "no memory left for the KV cache after weights and activations: raise "
            "gpu_memory_utilization, lower max_num_batched_tokens, or raise tensor_parallel_size"
        )

    layout = kv_layout(profile, tp, kv_bytes, _block_size(profile, settings, gpu))
    avail_bytes = max(0, available)
    if auto_len:
        fitted = max_model_len_that_fits(layout, avail_bytes, model_max, max_num_batched_tokens)
        if fitted == 0 and not errors:
            errors.append("cannot auto-fit max_model_len: not enough memory for a single token")
        max_len = fitted
    num_blocks = layout.num_blocks(avail_bytes) if layout.page_bytes else 0
    per_request = layout.blocks_per_request(max_len, max_num_batched_tokens) if layout.groups else 0
    concurrency = num_blocks / per_request if per_request else 0.0
    needed = layout.bytes_per_request(max_len, max_num_batched_tokens) if layout.groups else 0
    if available > 0 and needed > available and not auto_len:
        fits_len = max_model_len_that_fits(layout, avail_bytes, max_len, max_num_batched_tokens)
        errors.append(
            f"P02: one request at max_model_len {max_len} needs {_gib(needed):.2f} GiB of KV cache "
            f"but only {_gib(available):.2f} GiB is available; the largest length that fits is "
            f"{fits_len}: lower max_model_len, use --kv-cache-dtype fp8, or raise "
            "gpu_memory_utilization / tensor_parallel_size"
        )
    warnings += rules.utilization_warnings(
        util, fmt.quantized_bytes_per_param <= 1.01 and fmt.quantization is not None,
        profile.params.total,
    )
    if concurrency and concurrency < 1 <= max_num_seqs and not errors:
        warnings.append(f"P09: fewer than one request fits at {max_len} tokens")

    return MemoryEstimate(
        total_memory_gib=_gib(total),
        requested_memory_gib=_gib(requested),
        weights_gib=_gib(weights.per_gpu_bytes),
        activation_gib=_gib(activation),
        non_torch_gib=_gib(non_torch),
        cuda_graph_gib=_gib(cuda_graph),
        cuda_graph_in_budget=graph_in_budget,
        cuda_context_gib=_gib(overheads.CUDA_CONTEXT_BYTES),
        kv_cache_gib=_gib(max(0, available)),
        kv_bytes_per_token=layout.bytes_per_token_total,
        kv_bytes_per_token_per_gpu=layout.bytes_per_token_per_gpu,
        block_size=layout.block_size,
        num_gpu_blocks=num_blocks,
        kv_cache_tokens=_kv_tokens(layout, num_blocks, concurrency, max_len, era),
        max_model_len=max_len,
        max_concurrency=round(concurrency, 2),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        tensor_parallel_size=tp,
        gpu_memory_utilization=util,
        dtype=dtype,
        kv_cache_dtype=kv_dtype,
        quantization=quantization,
        vllm_version=version,
        fits=not errors,
        warnings=warnings,
        errors=errors,
    )
