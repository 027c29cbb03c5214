"""The start-up lines real vLLM logs about memory, in vLLM's own format.

The first lines users (and `inferplane diagnose`, `inferplane.engines.vllm_log`) grep an
engine's log for: the context length, the weights loaded, the memory left for the KV cache,
`GPU KV cache size: N tokens, Maximum concurrency for L tokens per request: Cx` (one line
since vLLM 0.2x; the CPU build says `CPU KV cache size`) and the memory profile. The numbers
are the simulated engine's own (the estimator's `MemoryEstimate`), so a simulated fleet's logs
read like a real one's. Format as vLLM 0.31's GPU worker prints them
(tests/data/vllm_logs/llama31-8b-a100-80g-v0310.yaml).
"""

from __future__ import annotations

import time

from inferplane.sim.build import EngineParts


def _line(pid: int, where: str, message: str, now: float) -> str:
    stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(now))
    return f"(EngineCore pid={pid}) INFO {stamp} [{where}] {message}"


def startup_lines(parts: EngineParts, pid: int, load_seconds: float = 0.0,
                  now: float | None = None) -> list[str]:
    """vLLM's memory lines for the engine `parts` describes."""
    memory = parts.memory
    at = time.time() if now is None else now
    free = memory.total_memory_gib  # a simulated card starts empty
    lines = [
        ("model.py:2152", f"Using max model len {memory.max_model_len}"),
        ("model_runner.py:407",
         f"Model loading took {memory.weights_gib:.2f} GiB memory and {load_seconds:.6f} seconds"),
        ("gpu_worker.py:692", f"Available KV cache memory: {memory.kv_cache_gib:.2f} GiB"),
        ("kv_cache_utils.py:2464",
         f"GPU KV cache size: {memory.kv_cache_tokens:,} tokens, Maximum concurrency for "
         f"{memory.max_model_len:,} tokens per request: {memory.max_concurrency:.2f}x"),
        ("gpu_worker.py:955",
         f"Free memory on device ({free:.2f}/{memory.total_memory_gib:.2f} GiB) on startup. "
         f"Desired GPU memory utilization is ({memory.gpu_memory_utilization}, "
         f"{memory.requested_memory_gib:.2f} GiB). Actual usage is "
         f"{memory.weights_gib + memory.non_torch_gib:.2f} GiB for consumed memory (weights + "
         f"non-torch), {memory.activation_gib:.2f} GiB for peak activation, and "
         f"{memory.cuda_graph_gib:.2f} GiB for CUDAGraph memory."),
    ]
    return [_line(pid, where, message, at) for where, message in lines]
