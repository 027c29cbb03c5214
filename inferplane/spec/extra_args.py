"""`extra_args:` — engine flags inferplane has no field for, passed through as `--flag value`.

Flags that a first-class field owns are rejected, naming the field: two sources of truth for
e.g. the tensor-parallel size would let the planner and the engine disagree.
"""

from __future__ import annotations

import json
from typing import Any

from inferplane.engines.options import ExtraArgValue, Scalar, extra_args_argv
from inferplane.spec.problems import Issue

__all__ = [
    "ASSIGNED_FLAGS", "OWNED_FLAGS", "ExtraArgValue", "Scalar", "check_extra_args",
    "extra_args_argv", "normalise_flag",
]

# vLLM flag (without dashes) -> the fleet-file field that owns it.
OWNED_FLAGS: dict[str, str] = {
    "model": "source",
    "served-model-name": "served_model_name",
    "tensor-parallel-size": "tensor_parallel_size",
    "tp": "tensor_parallel_size",
    "pipeline-parallel-size": "pipeline_parallel_size",
    "pp": "pipeline_parallel_size",
    "gpu-memory-utilization": "gpu_memory_utilization",
    "max-model-len": "max_model_len",
    "max-num-seqs": "max_num_seqs",
    "max-num-batched-tokens": "max_num_batched_tokens",
    "dtype": "dtype",
    "quantization": "quantization",
    "q": "quantization",
    "kv-cache-dtype": "kv_cache_dtype",
    "kv-cache-memory": "kv_cache_memory_gib",
    "kv-cache-memory-bytes": "kv_cache_memory_gib",
    "enforce-eager": "enforce_eager",
    "task": "task",
    "runner": "task",
    "convert": "task",
}

# Flags the planner or runtime assigns per instance; the user cannot pick them per model.
ASSIGNED_FLAGS: dict[str, str] = {
    "port": "the runtime assigns each instance a port",
    "host": "the runtime binds engines to 127.0.0.1 behind the gateway",
    **dict.fromkeys(
        ("nnodes", "node-rank", "master-addr", "master-port", "headless"),
        "the planner sets it on each node of a replica that spans nodes "
        "(pipeline_parallel_size)",
    ),
}


def normalise_flag(key: str) -> str:
    """`--enable_prefix_caching` and `enable-prefix-caching` are the same flag."""
    return key.lstrip("-").replace("_", "-")


def check_extra_args(args: dict[str, Any]) -> tuple[dict[str, ExtraArgValue], list[Issue]]:
    """Normalised flags and the issues found; issue locs are relative to `extra_args`."""
    normalised: dict[str, ExtraArgValue] = {}
    issues: list[Issue] = []
    for key, value in args.items():
        if not isinstance(key, str) or not normalise_flag(key):
            issues.append(Issue((str(key),), "flag name must be a non-empty string", key))
            continue
        flag = normalise_flag(key)
        base = flag.removeprefix("no-")
        if base in OWNED_FLAGS:
            field = OWNED_FLAGS[base]
            issues.append(
                Issue(
                    (key,),
                    f"--{flag} is set by the model field `{field}`",
                    value,
                    f"remove it from extra_args and set `{field}:` on the model",
                )
            )
            continue
        if flag in ASSIGNED_FLAGS:
            issues.append(
                Issue((key,), f"--{flag} cannot be set per model", value, ASSIGNED_FLAGS[flag])
            )
            continue
        if flag in normalised:
            issues.append(
                Issue((key,), f"--{flag} is given twice", value, "keep one spelling of the flag")
            )
            continue
        problem = _value_problem(value)
        if problem:
            issues.append(Issue((key,), problem, value, _VALUE_FIX))
            continue
        normalised[flag] = value
    return normalised, issues


_VALUE_FIX = (
    "use a string, number or true/false, a list of those (--flag a b), "
    "or a mapping (passed as JSON)"
)


def _value_problem(value: Any) -> str | None:
    if value is None:
        return "flag value is empty"
    if isinstance(value, Scalar):
        return None
    if isinstance(value, list):
        if not value:
            return "flag value is an empty list"
        if all(isinstance(item, Scalar) for item in value):
            return None
        return "list items must be strings, numbers or booleans"
    if isinstance(value, dict):
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            return "mapping cannot be written as JSON"
        return None
    return f"flag value of type {type(value).__name__} is not supported"
