"""Turn a `SimEngineConfig` into the pieces of an engine: profile, KV capacity, timing."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from inferplane.errors import InferplaneError
from inferplane.estimator.lora import LoraSlots
from inferplane.estimator.memory import estimate_memory
from inferplane.estimator.types import EngineSettings, MemoryEstimate
from inferplane.estimator.weights import expert_bytes_per_gpu, weight_format
from inferplane.gpus import GIB, GpuSpec, lookup_gpu
from inferplane.models import ModelProfile, load_profile, profile_from_config
from inferplane.models.profile import Task
from inferplane.sim.config import SimEngineConfig
from inferplane.sim.formats import weight_format as format_name
from inferplane.sim.timing import (
    DEFAULT_CALIBRATION,
    Calibration,
    StepTimeModel,
    model_cost,
)
from inferplane.sim.tokens import Tokenizer, load_tokenizer

# Built-in profile when neither a model directory nor a config is given: the shape of
# Qwen/Qwen3-0.6B (config.json of the Hugging Face checkpoint), small enough that many
# simulated engines of it are plausible on one GPU type.
DEFAULT_PROFILE_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "head_dim": 128,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
    "rope_scaling": None,
    "sliding_window": None,
    "use_sliding_window": False,
}
DEFAULT_PROFILE_NAME = "Qwen/Qwen3-0.6B"


@dataclass(frozen=True)
class EngineParts:
    """Everything an engine needs, resolved once at start-up."""

    config: SimEngineConfig
    profile: ModelProfile
    gpu: GpuSpec
    memory: MemoryEstimate
    timing: StepTimeModel
    tokenizer: Tokenizer
    # vLLM's ModelConfig.is_matryoshka / matryoshka_dimensions (config.json): whether
    # embeddings requests may set `dimensions`, and which values.
    is_matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] | None = None


RUNNER_TASKS: dict[str, Task] = {"generate": "generate", "pooling": "embed"}  # --runner -> task


def resolve_profile(config: SimEngineConfig) -> ModelProfile:
    if config.model_dir is not None:
        profile = load_profile(config.model_dir, name=config.model)
    elif config.model_config is not None:
        profile = load_profile(config.model_config, name=config.model)
    else:
        profile = profile_from_config(DEFAULT_PROFILE_CONFIG, name=DEFAULT_PROFILE_NAME)
    if config.runner == "auto":
        return profile
    if config.runner not in RUNNER_TASKS:
        raise InferplaneError(
            "unknown runner", field="runner", value=config.runner,
            fix="use auto, generate or pooling (vLLM's --runner)",
        )
    return replace(profile, default_task=RUNNER_TASKS[config.runner])


def engine_settings(config: SimEngineConfig) -> EngineSettings:
    lora = config.lora  # --enable-lora: the adapter slots come out of the KV cache, as vLLM's
    return EngineSettings(
        lora=LoraSlots(lora.max_loras, lora.max_lora_rank) if lora is not None else None,
        tensor_parallel_size=config.tensor_parallel_size,
        gpu_memory_utilization=config.gpu_memory_utilization,
        max_model_len=config.max_model_len,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        kv_cache_memory_bytes=config.kv_cache_memory_bytes,
    )


def build_parts(config: SimEngineConfig, profile: ModelProfile | None = None) -> EngineParts:
    """Resolve profile, GPU and the estimator's KV capacity; refuse what vLLM would refuse."""
    if config.faults.slowdown <= 0:
        raise InferplaneError(
            "must be > 0", field="slowdown", value=config.faults.slowdown,
            fix="use 1 for normal speed",
        )
    if not 0 <= config.faults.fail_rate <= 1:
        raise InferplaneError(
            "must be in [0, 1]", field="fail_rate", value=config.faults.fail_rate,
            fix="use a fraction such as 0.05",
        )
    if config.enable_auto_tool_choice and not config.tool_call_parser:
        # vLLM refuses this command line at start-up (validate_parsed_serve_args).
        raise InferplaneError(
            "--enable-auto-tool-choice requires --tool-call-parser",
            field="tool_call_parser", value=None,
            fix="name the parser vLLM would use, e.g. --tool-call-parser hermes "
                "(extra_args: {tool-call-parser: hermes})",
        )
    profile = profile or resolve_profile(config)
    gpu = lookup_gpu(config.gpu)
    memory = estimate_memory(profile, engine_settings(config), gpu=gpu)
    if not memory.fits or memory.num_gpu_blocks < 1:
        reasons = "; ".join(memory.errors) or "no room for the KV cache"
        raise InferplaneError(
            f"{profile.name} does not fit on {gpu.name} x{config.tensor_parallel_size}: {reasons}",
            field="model",
            fix="use a bigger GPU, a larger --tensor-parallel-size or a smaller --max-model-len",
        )
    timing = step_time_model(profile, memory, gpu, config.tensor_parallel_size,
                             config.calibration, config.faults.slowdown)
    tokenizer = load_tokenizer(config.model_dir, profile.vocab_size)
    is_matryoshka, dimensions = _matryoshka(config)
    return EngineParts(config, profile, gpu, memory, timing, tokenizer, is_matryoshka,
                       dimensions)


def step_time_model(profile: ModelProfile, memory: MemoryEstimate, gpu: GpuSpec, tp: int,
                    calibration: Calibration = DEFAULT_CALIBRATION,
                    slowdown: float = 1.0) -> StepTimeModel:
    """The step-time model of `profile` on `gpu` x `tp` with the estimator's byte counts:
    routed-expert bytes apart (MoE reads only the experts a step touches) and the weight
    format, so quantized kernels run at their fitted efficiency."""
    fmt = weight_format(profile, memory.dtype, memory.quantization)
    quantized = memory.quantization is not None
    weights = memory.weights_gib * GIB
    cost = model_cost(
        profile,
        weight_bytes_per_gpu=weights,
        kv_bytes_per_token_per_gpu=memory.kv_bytes_per_token_per_gpu,
        tensor_parallel_size=tp,
        expert_bytes_per_gpu=min(expert_bytes_per_gpu(profile, fmt, tp), weights),
        weight_format=format_name(memory.quantization),
        quantized_dense=fmt.quantizes_linear and quantized,
        quantized_experts=fmt.quantizes_experts and quantized,
    )
    fp8 = memory.quantization in ("fp8", "modelopt", "fbgemm_fp8") and gpu.supports_fp8
    return StepTimeModel(cost=cost, gpu=gpu, calibration=calibration, use_fp8_compute=fp8,
                         slowdown=slowdown)


def _matryoshka(config: SimEngineConfig) -> tuple[bool, tuple[int, ...] | None]:
    """config.json's `matryoshka_dimensions` / `is_matryoshka`, read as vLLM reads them."""
    path = config.model_dir or config.model_config
    if path is not None and path.is_dir():
        path = path / "config.json"
    if path is None or not path.is_file():
        return False, None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False, None  # the profile loader already reported a broken config.json
    if not isinstance(raw, dict):
        return False, None
    dims = raw.get("matryoshka_dimensions")
    allowed = tuple(int(d) for d in dims) if isinstance(dims, list) and dims else None
    return bool(allowed) or bool(raw.get("is_matryoshka", False)), allowed
