"""Run the estimator on a published vLLM startup (a `VllmLogCase`) and compare.

Shared by tests/test_estimate_vs_vllm_logs.py and benchmarks/estimate_accuracy.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_log_cases import VllmLogCase

from inferplane.engines.vllm.defaults import default_batch_limits
from inferplane.engines.vllm.versions import default_gpu_memory_utilization, era_of
from inferplane.estimator.memory import estimate_memory
from inferplane.estimator.types import EngineSettings, MemoryEstimate
from inferplane.gpus import find_gpu
from inferplane.gpus.spec import GIB
from inferplane.models import load_profile

# Published peak activations that are not whole startup logs (checked in
# tests/test_estimate_sampler_warmup.py, printed by benchmarks/estimate_accuracy.py):
# llm-d's H100 (79.18 GiB) profile, `vllm serve`, max_model_len 16000, utilization 0.9, the
# H100 defaults 1,024 sequences / 8,192 batched tokens, block size 128, "Peak Activation (GiB)"
# https://github.com/llm-d/llm-d-benchmark/blob/259334868c5075da530cc6c90b43fceb11b6e6a7/config_explorer/empirical-vllm-memory-results.md
# No release is named; the line it is read from exists from v0.10.2 and the peaks are the
# PyTorch-native sampler's (0.10-0.16): 0.11.0 is used. Llama-3.3-70B has Llama-3.1-70B's
# architecture. (model folder under tests/data/models, TP, logged GiB)
LLMD_H100_VERSION = "0.11.0"
LLMD_H100_ACTIVATION = [
    ("meta-llama--Llama-3.1-8B-Instruct", 1, 4.76),
    ("Qwen--Qwen3-32B", 1, 5.64),
    ("openai--gpt-oss-20b", 1, 7.38),
    ("openai--gpt-oss-120b", 1, 7.38),
    ("meta-llama--Llama-3.1-70B-Instruct", 2, 4.84),
]


def llmd_h100_activation_gib(model: str, tp: int) -> float:
    """Our activation peak for one row of LLMD_H100_ACTIVATION."""
    from vllm_log_cases import MODELS_DIR

    gpu = find_gpu("H100-SXM-80GB")
    settings = EngineSettings(tensor_parallel_size=tp, max_model_len=16000, block_size=128,
                              vllm_version=LLMD_H100_VERSION)
    return estimate_memory(load_profile(MODELS_DIR / model), settings, gpu=gpu).activation_gib


# Logs that print no version (V0 "Memory profiling results" format) date to about this one.
UNDATED_V0_VERSION = "0.6.4"
NOMINAL_UNKNOWN_GPU_BYTES = 80 * GIB


@dataclass(frozen=True)
class CaseComparison:
    case: VllmLogCase
    estimate: MemoryEstimate
    logged_weights_gib: float | None
    logged_kv_tokens: int | None
    logged_kv_gib: float | None

    @property
    def weights_error(self) -> float | None:
        if self.logged_weights_gib is None:
            return None
        return (self.estimate.weights_gib - self.logged_weights_gib) / self.logged_weights_gib

    @property
    def kv_tokens_error(self) -> float | None:
        if not self.logged_kv_tokens:
            return None
        return (self.estimate.kv_cache_tokens - self.logged_kv_tokens) / self.logged_kv_tokens

    @property
    def kv_gib_error(self) -> float | None:
        if not self.logged_kv_gib:
            return None
        return (self.estimate.kv_cache_gib - self.logged_kv_gib) / self.logged_kv_gib


def _logged_tokens(case: VllmLogCase, block_size: int) -> int | None:
    facts = case.facts
    if facts.kv_cache_tokens:
        return facts.kv_cache_tokens
    if facts.num_gpu_blocks:
        return facts.num_gpu_blocks * block_size
    return None


def estimate_case(case: VllmLogCase) -> CaseComparison:
    s = case.settings
    version = case.vllm_version or UNDATED_V0_VERSION
    # Drop notes like "(GCE a2-highgpu-1g)"; a log may name no GPU but print its memory.
    gpu = find_gpu(case.gpu.split("(")[0].strip())
    if case.gpu_total_gib:
        total = int(case.gpu_total_gib * GIB)
    elif gpu is not None:
        total = gpu.total_memory_bytes
    else:
        # Weights don't depend on the card; KV figures can't be compared without its size.
        total = NOMINAL_UNKNOWN_GPU_BYTES
    max_num_seqs = s.get("max_num_seqs")
    max_batched = s.get("max_num_batched_tokens")
    if case.entrypoint == "llm" and era_of(version) != "v0":
        # The offline LLM class batches more tokens than `vllm serve` does by default.
        gpu_name = gpu.name if gpu else None
        seqs, tokens = default_batch_limits(total, gpu_name, 0, era_of(version), offline=True)
        max_num_seqs = max_num_seqs or seqs
        max_batched = max_batched or tokens
    settings = EngineSettings(
        tensor_parallel_size=s.get("tensor_parallel_size") or 1,
        gpu_memory_utilization=(
            s.get("gpu_memory_utilization") or default_gpu_memory_utilization(version)
        ),
        max_model_len=s.get("max_model_len"),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_batched,
        dtype=s.get("dtype") or "auto",
        quantization=s.get("quantization"),
        kv_cache_dtype=s.get("kv_cache_dtype") or "auto",
        enforce_eager=bool(s.get("enforce_eager")),
        block_size=s.get("block_size"),
        vllm_version=version,
    )
    # KV figures need the card's size and every setting that shapes the pool.
    known_size = (gpu is not None or bool(case.gpu_total_gib)) and not case.unknown_settings
    estimate = estimate_memory(
        load_profile(case.model_dir), settings, gpu=gpu, gpu_memory_bytes=total
    )
    return CaseComparison(
        case=case,
        estimate=estimate,
        logged_weights_gib=case.facts.weights_gib,
        logged_kv_tokens=_logged_tokens(case, estimate.block_size) if known_size else None,
        logged_kv_gib=case.facts.available_kv_gib if known_size else None,
    )
