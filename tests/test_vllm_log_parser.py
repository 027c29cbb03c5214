"""The vLLM startup-log parser: every real case, plus synthetic (made-up) lines of each era."""
# ruff: noqa: E501  (log lines are kept whole, as vLLM prints them)

from __future__ import annotations

import pytest
from vllm_log_cases import LOG_DIR, VllmLogCase, load_cases

from inferplane.engines.vllm_log import parse_startup_log

CASES = load_cases()


def test_there_are_cases() -> None:
    assert len(CASES) >= 5
    assert (LOG_DIR / "README.md").is_file()


@pytest.mark.parametrize("case", CASES, ids=[c.case_id for c in CASES])
def test_every_case_has_weights_and_a_kv_figure(case: VllmLogCase) -> None:
    # A URL, or (when the search index holds the file but not its repository) the index id.
    assert case.source_url.startswith(("https://", "stored public GitHub file, search-index id"))
    assert case.facts.weights_gib is not None and case.facts.weights_gib > 0
    assert case.facts.has_kv_figure()


@pytest.mark.parametrize("case", CASES, ids=[c.case_id for c in CASES])
def test_case_readme_lists_it(case: VllmLogCase) -> None:
    assert case.case_id in (LOG_DIR / "README.md").read_text(encoding="utf-8")


def test_real_case_values() -> None:
    by_id = {c.case_id: c.facts for c in CASES}
    q = by_id["qwen3-8b-a100-40g-v0191"]
    assert (q.weights_gib, q.available_kv_gib, q.kv_cache_tokens) == (15.27, 19.36, 140_960)
    assert (q.max_concurrency, q.concurrency_tokens) == (3.44, 40_960)
    assert (q.cuda_graph_gib, q.cuda_graph_estimate_gib) == (2.44, 2.35)
    assert q.num_gpu_blocks is None and q.num_gpu_blocks_override == 512
    assert q.vllm_version == "0.19.1" and q.max_model_len == 40960
    v0 = by_id["llama31-8b-rtx3090-v0-29k"]
    assert (v0.weights_gib, v0.available_kv_gib, v0.num_gpu_blocks) == (14.9888, 2.89, 1478)
    assert (v0.total_gpu_memory_gib, v0.gpu_memory_utilization) == (23.58, 0.90)
    assert v0.max_kv_tokens_v0 == 23_648 and v0.errors
    new = by_id["llama31-8b-a100-80g-v0310"]
    assert (new.weights_gib, new.available_kv_gib, new.kv_cache_tokens) == (15.0, 56.21, 460_496)
    assert (new.max_concurrency, new.concurrency_tokens) == (3.51, 131_072)
    # v0.2x+ summary: weights + non-torch as one "consumed" figure; the peak-activation
    # figure includes the CUDA-graph estimate (gpu_worker.py: transient peak + estimate).
    assert (new.free_memory_gib, new.total_gpu_memory_gib, new.gpu_memory_utilization) == (
        78.84, 79.25, 0.92
    )
    assert (new.consumed_gib, new.activation_peak_gib, new.cuda_graph_gib) == (15.26, 1.44, 0.23)


def test_v1_early_multi_worker_takes_first_weights_and_min_kv() -> None:
    log = """
(VllmWorker rank=0 pid=105) INFO 04-29 01:07:41 [gpu_model_runner.py:1347] Model loading took 14.2474 GiB and 558.868858 seconds
(VllmWorker rank=2 pid=107) INFO 04-29 01:07:41 [gpu_model_runner.py:1347] Model loading took 14.2474 GiB and 559.045517 seconds
(VllmWorker rank=0 pid=105) INFO 04-29 01:09:40 [gpu_worker.py:227] Available KV cache memory: 4.61 GiB
(VllmWorker rank=2 pid=107) INFO 04-29 01:09:40 [gpu_worker.py:227] Available KV cache memory: 4.55 GiB
qwen3-1  | INFO 04-29 01:09:49 [kv_cache_utils.py:634] GPU KV cache size: 198,784 tokens
qwen3-1  | INFO 04-29 01:09:49 [kv_cache_utils.py:637] Maximum concurrency for 8,192 tokens per request: 24.27x
"""
    f = parse_startup_log(log)
    assert f.weights_gib == 14.2474 and f.load_seconds == 558.868858
    assert f.weights_gib_per_worker == [14.2474, 14.2474]
    assert f.available_kv_gib == 4.55 and f.available_kv_gib_per_worker == [4.61, 4.55]
    assert (f.kv_cache_tokens, f.max_concurrency, f.concurrency_tokens) == (198_784, 24.27, 8192)


def test_v1_new_lines() -> None:
    log = """
(APIServer pid=1) INFO 05-28 07:55:40 [api_server.py:1896] vLLM API server version 0.21.0
(EngineCore pid=4108) INFO 05-28 08:00:10 [gpu_model_runner.py:4820] Model loading took 15.27 GiB memory and 9.5 seconds
(EngineCore pid=4108) INFO 05-28 08:00:25 [gpu_model_runner.py:6142] Estimated CUDA graph memory: 0.52 GiB total
(EngineCore pid=4108) INFO 05-28 08:00:26 [gpu_worker.py:462] Available KV cache memory: 6.37 GiB
(EngineCore pid=4108) INFO 05-28 08:00:26 [gpu_worker.py:477] CUDA graph memory profiling is enabled (default since v0.21.0). The current --gpu-memory-utilization=0.9764 is equivalent to --gpu-memory-utilization=0.9543 without CUDA graph memory profiling.
(EngineCore pid=4108) INFO 05-28 08:00:26 [kv_cache_utils.py:1710] GPU KV cache size: 46,368 tokens
(EngineCore pid=4108) INFO 05-28 08:00:26 [kv_cache_utils.py:1711] Maximum concurrency for 16,384 tokens per request: 2.83x
"""
    f = parse_startup_log(log)
    assert f.vllm_version == "0.21.0"
    assert (f.weights_gib, f.load_seconds) == (15.27, 9.5)
    assert f.cuda_graph_gib == 0.52 and f.cuda_graph_estimate_gib == 0.52
    assert f.gpu_memory_utilization == 0.9764
    assert (f.available_kv_gib, f.kv_cache_tokens, f.max_concurrency) == (6.37, 46_368, 2.83)


def test_v1_single_line_tokens_and_concurrency() -> None:
    f = parse_startup_log(
        "INFO [kv_cache_utils.py:1087] GPU KV cache size: 190,464 tokens, "
        "Maximum concurrency for 32,768 tokens per request: 5.81x"
    )
    assert (f.kv_cache_tokens, f.concurrency_tokens, f.max_concurrency) == (190_464, 32_768, 5.81)
    assert f.weights_gib is None


def test_v1_mid_free_memory_summary() -> None:
    f = parse_startup_log(
        "(Worker_TP2_EP2 pid=2080) INFO 09-24 20:54:35 [gpu_worker.py:391] Free memory on "
        "device (43.93/44.42 GiB) on startup. Desired GPU memory utilization is (0.9, 39.98 "
        "GiB). Actual usage is 27.72 GiB for weight, 1.4 GiB for peak activation, 0.21 GiB "
        "for non-torch memory, and 3.45 GiB for CUDAGraph memory. Replace ..."
    )
    assert (f.free_memory_gib, f.total_gpu_memory_gib) == (43.93, 44.42)
    assert (f.activation_peak_gib, f.non_torch_gib, f.cuda_graph_gib) == (1.4, 0.21, 3.45)


def test_v0_formats() -> None:
    log = """
INFO 07-24 14:03:30 api_server.py:219] vLLM API server version 0.5.3.post1
INFO 07-24 14:07:31 model_runner.py:692] Loading model weights took 57.7520 GB
INFO 07-24 14:07:40 distributed_gpu_executor.py:56] # GPU blocks: 4426, # CPU blocks: 1638
INFO 07-24 14:08:01 model_runner.py:1181] Graph capturing finished in 21 secs, took 0.47 GiB
"""
    f = parse_startup_log(log)
    assert f.vllm_version == "0.5.3.post1"
    assert (f.weights_gib, f.num_gpu_blocks, f.num_cpu_blocks) == (57.752, 4426, 1638)
    assert f.cuda_graph_gib == 0.47 and f.available_kv_gib is None
    cuda = parse_startup_log("INFO executor_base.py:110] # cuda blocks: 7354, # CPU blocks: 2048")
    assert (cuda.num_gpu_blocks, cuda.num_cpu_blocks) == (7354, 2048)


def test_v0_profiling_summary_v07() -> None:
    log = """
INFO 02-10 10:00:00 llm_engine.py:232] Initializing a V0 LLM engine (v0.7.2) with config: model='m', max_seq_len=8192
INFO 02-10 10:00:20 worker.py:267] the current vLLM instance can use total_gpu_memory (79.22GiB) x gpu_memory_utilization (0.90) = 71.29GiB
INFO 02-10 10:00:20 worker.py:267] model weights take 14.99GiB; non_torch_memory takes 0.13GiB; PyTorch activation peak memory takes 1.23GiB; the rest of the memory reserved for KV Cache is 54.94GiB.
"""
    f = parse_startup_log(log)
    assert f.vllm_version == "0.7.2" and f.engine == "V0" and f.max_model_len == 8192
    assert (f.total_gpu_memory_gib, f.gpu_memory_utilization) == (79.22, 0.90)
    assert (f.available_kv_gib, f.non_torch_gib, f.activation_peak_gib) == (54.94, 0.13, 1.23)


def test_failures() -> None:
    free = parse_startup_log(
        "ValueError: Free memory on device cuda:0 (7.5/23.55 GiB) on startup is less than "
        "desired GPU memory utilization (0.9, 21.2 GiB). Decrease GPU memory utilization."
    )
    assert (free.free_memory_gib, free.total_gpu_memory_gib) == (7.5, 23.55)
    assert free.gpu_memory_utilization == 0.9 and free.errors
    short = parse_startup_log(
        "ValueError: To serve at least one request with the models's max seq len (221000), "
        "(10.12 GiB KV cache is needed, which is larger than the available KV cache memory "
        "(5.59 GiB). Based on the available memory, the estimated maximum model length is "
        "122080. Try increasing `gpu_memory_utilization`"
    )
    assert (short.needed_kv_gib, short.available_kv_gib) == (10.12, 5.59)
    assert short.estimated_max_model_len == 122_080
    none = parse_startup_log("ValueError: No available memory for the cache blocks. Try ...")
    assert none.errors and not none.has_kv_figure()


def test_empty_log() -> None:
    f = parse_startup_log("nothing to see")
    assert f.weights_gib is None and not f.has_kv_figure() and f.errors == []


def test_v1_early_gpu_blocks_without_cpu_blocks() -> None:
    # Real format (vllm#12569, V1 engine, Jan 2025): no "# CPU blocks" after the GPU count.
    f = parse_startup_log(
        "INFO 01-30 03:18:12 gpu_model_runner.py:848] Loading model weights took 67.7229 GB\n"
        "INFO 01-30 03:19:14 kv_cache_utils.py:395] # GPU blocks: 1381\n"
        "INFO 01-30 03:19:14 kv_cache_utils.py:398] Maximum concurrency for 2048 tokens per request: 10.79x\n"
    )
    assert (f.weights_gib, f.num_gpu_blocks, f.num_cpu_blocks) == (67.7229, 1381, None)
    assert (f.concurrency_tokens, f.max_concurrency) == (2048, 10.79)
    assert f.has_kv_figure()
