"""The command line of one simulated engine (`python -m inferplane sim ...`).

The simulator speaks vLLM's API and accepts vLLM's sizing flags, so it queues and preempts
where the planned vLLM would; on top it takes the simulated GPU, the model directory and
fault injection (supervision tests and demos). Callers pass plain data: the engine
boundary imports no fleet-file or plan types.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from inferplane.engines.options import ExtraArgValue, extra_args_argv
from inferplane.engines.vllm.lora import LoraArgs, module_item

# The `extra_args` a simulated engine honours as vLLM does (they change which requests it
# accepts); the others tune what the simulator does not model and are not passed.
SIM_EXTRA_FLAGS = ("max-logprobs", "enable-auto-tool-choice", "tool-call-parser")


@dataclass(frozen=True)
class SimFaults:
    """Simulated misbehaviour (mirrors `inferplane.sim.config.FaultConfig`)."""

    load_time_s: float = 0.0
    fail_rate: float = 0.0
    slowdown: float = 1.0
    crash_after_requests: int | None = None
    hang_after_requests: int | None = None
    die_after_tokens: int | None = None


@dataclass(frozen=True)
class SimLaunchArgs:
    """What one simulated engine is started with; sizing fields left None are not passed
    (the simulator then picks vLLM's defaults)."""

    served_model_name: str
    host: str
    port: int
    gpu: str
    model_dir: str | None = None  # a local HF model directory (config.json, tokenizer)
    task: str = "generate"
    max_model_len: int | None = None
    tensor_parallel_size: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_memory_bytes: int | None = None
    extra_args: Mapping[str, ExtraArgValue] = field(default_factory=dict)
    faults: SimFaults | None = None
    lora: LoraArgs | None = None  # vLLM's LoRA options (engines/vllm/lora.py)


def sim_argv(args: SimLaunchArgs, *, python: str = sys.executable) -> tuple[str, ...]:
    argv = [
        python, "-m", "inferplane", "sim",
        "--model", args.served_model_name,
        "--host", args.host,
        "--port", str(args.port),
        "--gpu", args.gpu,
    ]
    if args.model_dir is not None:
        argv += ["--model-dir", args.model_dir]
    sizing: tuple[tuple[str, object], ...] = (
        ("max-model-len", args.max_model_len),
        ("tensor-parallel-size", args.tensor_parallel_size),
        ("max-num-seqs", args.max_num_seqs),
        ("max-num-batched-tokens", args.max_num_batched_tokens),
        ("gpu-memory-utilization", args.gpu_memory_utilization),
        ("kv-cache-memory-bytes", args.kv_cache_memory_bytes),
    )
    argv += [item for flag, value in sizing if value is not None
             for item in (f"--{flag}", str(value))]
    if args.task == "embed":  # as the vLLM argv does (--runner pooling)
        argv += ["--runner", "pooling"]
    argv += extra_args_argv({flag: value for flag, value in args.extra_args.items()
                             if flag in SIM_EXTRA_FLAGS})
    lora = args.lora
    if lora is not None:  # the simulator's CLI takes each adapter as its own option
        argv += ["--enable-lora", "--max-loras", str(lora.max_loras),
                 "--max-lora-rank", str(lora.max_lora_rank)]
        if lora.max_cpu_loras is not None:
            argv += ["--max-cpu-loras", str(lora.max_cpu_loras)]
        for module in lora.modules:
            argv += ["--lora-modules", module_item(module)]
    faults = args.faults
    if faults is not None:
        argv += ["--load-time-s", str(faults.load_time_s), "--fail-rate", str(faults.fail_rate)]
        argv += ["--slowdown", str(faults.slowdown)]
        if faults.crash_after_requests is not None:
            argv += ["--crash-after-requests", str(faults.crash_after_requests)]
        if faults.hang_after_requests is not None:
            argv += ["--hang-after-requests", str(faults.hang_after_requests)]
        if faults.die_after_tokens is not None:
            argv += ["--die-after-tokens", str(faults.die_after_tokens)]
    return tuple(argv)
