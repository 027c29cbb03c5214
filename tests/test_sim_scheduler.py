"""The simulator's scheduler and timing model on the simulated clock (deterministic)."""

from __future__ import annotations

from inferplane.sim.blocks import BlockPool, block_hashes
from inferplane.sim.build import build_parts
from inferplane.sim.config import SimEngineConfig
from inferplane.sim.core import EngineCore, KvCapacity
from inferplane.sim.offline import WorkItem, run_workload, synthetic_prompt
from inferplane.sim.timing import StepShape

PARTS = build_parts(SimEngineConfig(model="t", max_model_len=4096))


def _core(num_blocks: int = 4000, max_num_seqs: int = 64, budget: int = 2048) -> EngineCore:
    return EngineCore(KvCapacity(num_blocks, 16, max_num_seqs, budget), PARTS.timing)


def test_block_hashes_chain_prefixes() -> None:
    a = block_hashes(list(range(40)), 16)
    b = block_hashes([*range(32), 99, 98], 16)
    assert len(a) == 2 and a == b[:2]
    assert block_hashes([5, *range(1, 40)], 16)[1] != a[1]  # parent differs


def test_block_pool_reuses_freed_cached_blocks_until_evicted() -> None:
    pool = BlockPool(2)
    blocks = pool.allocate(2)
    assert blocks is not None and pool.usage == 1.0
    pool.cache(blocks[0], 111)
    pool.release(blocks)
    assert pool.usage == 0.0 and pool.cached_prefix([111]) == [blocks[0]]
    pool.allocate(2)  # evicts both, hash forgotten
    assert pool.cached_prefix([111]) == []


def test_decode_is_memory_bound_and_prefill_compute_bound() -> None:
    timing = PARTS.timing
    one = timing.step_time_s(StepShape(0, 1, 100, 100, 1))
    many = timing.step_time_s(StepShape(0, 32, 3200, 3200, 32))
    assert many < 3 * one  # batching decode is nearly free
    prefill = timing.step_time_s(StepShape(8192, 0, 8192, 8192 * 8193 // 2, 8))
    assert prefill > 5 * one


def test_exact_output_lengths_and_ttft_before_e2e() -> None:
    core = _core()
    result = run_workload(core, [WorkItem(synthetic_prompt(300, i), 50) for i in range(10)])
    assert result.completed == 10 and result.total_output_tokens == 500
    assert 0 < result.mean_ttft_s < result.duration_s


def test_overload_grows_queue_ttft_and_kv_usage() -> None:
    light = run_workload(_core(num_blocks=600), [
        WorkItem(synthetic_prompt(512, i), 128) for i in range(8)
    ], max_concurrency=2)
    heavy = run_workload(_core(num_blocks=600), [
        WorkItem(synthetic_prompt(512, i), 128) for i in range(120)
    ], max_concurrency=60)
    assert heavy.peak_waiting > 10 and light.peak_waiting == 0
    assert heavy.mean_ttft_s > 3 * light.mean_ttft_s
    assert heavy.peak_kv_usage > 0.9
    assert heavy.output_throughput_tok_s > light.output_throughput_tok_s


def test_kv_exhaustion_preempts_and_still_finishes() -> None:
    # 40 blocks of 16 tokens; 4 requests that each grow to 256 tokens cannot all fit.
    result = run_workload(_core(num_blocks=40, budget=512), [
        WorkItem(synthetic_prompt(64, i), 192) for i in range(4)
    ])
    assert result.preemptions > 0
    assert result.completed == 4 and result.total_output_tokens == 4 * 192


def test_shared_prefix_is_counted_as_hits() -> None:
    shared = synthetic_prompt(256, 7)
    items = [WorkItem([*shared, *synthetic_prompt(20, 100 + i)], 8) for i in range(10)]
    result = run_workload(_core(), items, max_concurrency=1)
    # All but the first reuse the 16 full blocks of the shared 256 tokens.
    assert abs(result.prefix_hit_rate - 9 * 256 / (10 * 276)) < 1e-9
    distinct = run_workload(_core(), [WorkItem(synthetic_prompt(276, i), 8) for i in range(10)])
    assert distinct.prefix_hit_rate == 0.0


def test_chunked_prefill_respects_token_budget() -> None:
    core = _core(budget=256)
    run = run_workload(core, [WorkItem(synthetic_prompt(1000, 1), 2)])
    # 1000 prompt tokens in 256-token chunks take 4 steps, then one decode step.
    assert core.steps == 5 and run.completed == 1
