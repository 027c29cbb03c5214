"""The exact `vllm serve` invocation for one instance, checked against the vLLM version.

One builder for the planner (the Plan's `argv`) and the one-host runtime: first-class
settings become their flags, `extra_args` follow, and every flag is checked against the
engine version (removed/renamed flags are errors naming the replacement, P32). JSON-valued
flags such as `--compilation-config` are one argv item, so no shell or YAML quoting can
break them (P05).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from inferplane.engines.options import ExtraArgValue, extra_args_argv
from inferplane.engines.vllm.flags import flag_problem
from inferplane.engines.vllm.lora import LoraArgs, lora_argv
from inferplane.engines.vllm.versions import DEFAULT_VLLM_VERSION, parse_version
from inferplane.errors import InferplaneError

COMPILATION_CONFIG_FLAG = "compilation-config"


@dataclass(frozen=True)
class VllmArgs:
    """Everything that goes on one `vllm serve` command line."""

    source: str
    served_model_name: str
    port: int
    max_model_len: int
    tensor_parallel_size: int
    gpu_memory_utilization: float | None  # None: not written (CPU: the KV size is explicit)
    host: str | None = None
    pipeline_parallel_size: int = 1  # > 1: one replica over that many nodes (multinode.py)
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    dtype: str = "auto"
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    kv_cache_memory_bytes: int | None = None
    enforce_eager: bool = False
    task: str = "generate"
    enable_prefix_caching: bool | None = None  # None: vLLM's default
    cudagraph_capture_sizes: tuple[int, ...] | None = None  # shrunk graph sizes (P05)
    lora: LoraArgs | None = None  # adapters served by this engine (engines/vllm/lora.py)
    extra_args: Mapping[str, ExtraArgValue] = field(default_factory=dict)


def build_vllm_argv(
    args: VllmArgs, *, version: str = DEFAULT_VLLM_VERSION, vllm: str = "vllm"
) -> list[str]:
    """`vllm serve ...` for `args` on vLLM `version`; raises InferplaneError for flags that
    version rejects."""
    _check_numbers(args)
    release = parse_version(version)
    argv = [vllm, "serve", args.source, "--served-model-name", args.served_model_name]
    if args.host is not None:
        argv += ["--host", args.host]
    argv += [
        "--port", str(args.port),
        "--max-model-len", str(args.max_model_len),
        "--tensor-parallel-size", str(args.tensor_parallel_size),
    ]
    if args.pipeline_parallel_size > 1:
        argv += ["--pipeline-parallel-size", str(args.pipeline_parallel_size)]
    if args.gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", f"{args.gpu_memory_utilization:g}"]
    if args.max_num_seqs is not None:
        argv += ["--max-num-seqs", str(args.max_num_seqs)]
    if args.max_num_batched_tokens is not None:
        argv += ["--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    if args.dtype != "auto":
        argv += ["--dtype", args.dtype]
    if args.quantization is not None:
        argv += ["--quantization", args.quantization]
    if args.kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", args.kv_cache_dtype]
    if args.kv_cache_memory_bytes is not None:
        argv += ["--kv-cache-memory-bytes", str(args.kv_cache_memory_bytes)]
    if args.enforce_eager:
        argv.append("--enforce-eager")
    if args.task == "embed":
        argv += ["--runner", "pooling"] if release >= (0, 10, 2) else ["--task", "embed"]
    if args.lora is not None:
        argv += lora_argv(args.lora, args.extra_args)
    extra = dict(args.extra_args)
    if args.enable_prefix_caching is not None and "enable-prefix-caching" not in extra:
        extra["enable-prefix-caching"] = args.enable_prefix_caching
    if args.cudagraph_capture_sizes is not None and not args.enforce_eager:
        extra[COMPILATION_CONFIG_FLAG] = _with_capture_sizes(
            extra.get(COMPILATION_CONFIG_FLAG), args.cudagraph_capture_sizes
        )
    argv += extra_args_argv(extra)
    check_argv(argv, version)
    return argv


def check_argv(argv: list[str], version: str) -> None:
    """Raise for the first flag in `argv` that vLLM `version` does not accept."""
    for item in argv:
        if not item.startswith("--"):
            continue
        problem = flag_problem(item.split("=", 1)[0], version)
        if problem is not None:
            message, fix = problem
            raise InferplaneError(message, field="extra_args", value=item, fix=fix)


def capture_sizes_from_extra_args(extra_args: Mapping[str, ExtraArgValue]) -> list[int] | None:
    """The user's own `cudagraph_capture_sizes` from `extra_args: {compilation-config: ...}`."""
    config = extra_args.get(COMPILATION_CONFIG_FLAG)
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except ValueError:
            return None
    if not isinstance(config, dict):
        return None
    sizes = config.get("cudagraph_capture_sizes")
    if isinstance(sizes, list) and all(isinstance(s, int) for s in sizes):
        return [int(s) for s in sizes]
    return None


def _with_capture_sizes(existing: ExtraArgValue | None, sizes: tuple[int, ...]) -> dict[str, Any]:
    config: dict[str, Any] = dict(existing) if isinstance(existing, dict) else {}
    config.setdefault("cudagraph_capture_sizes", list(sizes))
    return config


def _check_numbers(args: VllmArgs) -> None:
    where = f"models.{args.served_model_name}"
    if args.max_model_len < 1:
        raise InferplaneError(
            "max_model_len must be positive", field=f"{where}.max_model_len",
            value=args.max_model_len, fix="use the planner's context length",
        )
    util = args.gpu_memory_utilization
    if util is not None and not 0 < util <= 1:
        raise InferplaneError(
            "gpu_memory_utilization is a fraction of the card",
            field=f"{where}.gpu_memory_utilization", value=args.gpu_memory_utilization,
            fix="use a value in (0, 1]",
        )
    if args.tensor_parallel_size < 1:
        raise InferplaneError(
            "tensor_parallel_size must be >= 1", field=f"{where}.tensor_parallel_size",
            value=args.tensor_parallel_size, fix="use 1, 2, 4 or 8",
        )
    if args.pipeline_parallel_size < 1:
        raise InferplaneError(
            "pipeline_parallel_size must be >= 1", field=f"{where}.pipeline_parallel_size",
            value=args.pipeline_parallel_size, fix="use 1, or the number of nodes per replica",
        )
