"""vLLM's scheduler defaults for `vllm serve` (EngineArgs.get_batch_defaults)."""

from __future__ import annotations

GIB = 1024**3


def default_batch_limits(
    total_memory_bytes: int,
    gpu_name: str | None,
    max_model_len: int,
    era: str,
    *,
    offline: bool = False,
) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) vLLM picks when the user sets neither.

    Big-memory GPUs other than the A100 (H100, H200, B200, MI300X) get 1024 / 8192, the rest
    256 / 2048. The offline `LLM` class batches more tokens (16384 / 8192). V0 without chunked
    prefill batches a whole max_model_len prompt.
    """
    if era == "v0":
        return 256, max(max_model_len, 2048)
    big = total_memory_bytes >= 70 * GIB and "a100" not in (gpu_name or "").lower()
    if offline:
        return (1024, 16384) if big else (256, 8192)
    return (1024, 8192) if big else (256, 2048)
