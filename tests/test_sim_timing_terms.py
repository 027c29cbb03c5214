"""The step-time model's terms: MoE experts touched per step, weight formats, serving
overhead, and the per-generation constants."""

from __future__ import annotations

import itertools
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferplane.gpus import lookup_gpu
from inferplane.sim.build import build_parts
from inferplane.sim.config import SimEngineConfig
from inferplane.sim.core import EngineCore, KvCapacity
from inferplane.sim.formats import generation, weight_format
from inferplane.sim.moe_read import expected_distinct_experts
from inferplane.sim.offline import WorkItem, run_workload, synthetic_prompt
from inferplane.sim.timing import (
    DEFAULT_CALIBRATION,
    GENERATION_CALIBRATION,
    Calibration,
    StepShape,
    StepTimeModel,
    calibration_source,
)

MODELS = Path(__file__).resolve().parent / "data" / "models"


def _distinct_by_enumeration(experts: int, top_k: int, tokens: int) -> float:
    """Average distinct experts over every routing (each token: a k-subset, uniformly)."""
    subsets = list(itertools.combinations(range(experts), top_k))
    counts = [len(set().union(*routing))
              for routing in itertools.product(subsets, repeat=tokens)]
    return statistics.fmean(counts)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 5), st.data())
def test_expected_distinct_experts_matches_enumeration(experts: int, data: st.DataObject) -> None:
    top_k = data.draw(st.integers(1, experts))
    tokens = data.draw(st.integers(1, 3))
    exact = _distinct_by_enumeration(experts, top_k, tokens)
    assert abs(expected_distinct_experts(experts, top_k, tokens) - exact) < 1e-9


def test_experts_touched_grow_from_top_k_to_all() -> None:
    assert expected_distinct_experts(128, 8, 1) == 8
    assert 8 < expected_distinct_experts(128, 8, 4) < 32
    assert expected_distinct_experts(128, 8, 4096) > 127.99
    assert expected_distinct_experts(0, 0, 10) == 0


def _timing(model: str, gpu: str = "H100-SXM-80GB", tp: int = 1) -> StepTimeModel:
    return build_parts(SimEngineConfig(model="m", model_config=MODELS / model, gpu=gpu,
                                       tensor_parallel_size=tp, max_model_len=4096)).timing


def test_moe_decode_slows_with_batch_while_it_reads_more_experts() -> None:
    moe = _timing("Qwen--Qwen3-30B-A3B")
    dense = _timing("Qwen--Qwen3-8B")
    cal = replace(DEFAULT_CALIBRATION, step_overhead_s=0.0, per_seq_overhead_s=0.0)
    moe = replace(moe, calibration=cal)
    dense = replace(dense, calibration=cal)

    def step(t: StepTimeModel, seqs: int) -> float:
        return t.step_time_s(StepShape(0, seqs, seqs, seqs, seqs))

    # Dense: the weights are read once whatever the batch (1 token of context each).
    assert step(dense, 16) / step(dense, 1) < 1.01
    # MoE (128 experts, top-8): batch 16 touches ~81 experts against 8 at batch 1.
    assert step(moe, 16) / step(moe, 1) > 2.0
    assert moe.cost.expert_bytes > 0.8 * moe.cost.weight_bytes


def test_formats_and_generations() -> None:
    assert weight_format(None) == "bf16"
    assert weight_format("fp8") == "fp8" and weight_format("mxfp4") == "mxfp4"
    assert weight_format("awq_marlin") == "int4" and weight_format("gptq") == "int4"
    assert generation(lookup_gpu("H200")) == "hopper"
    assert generation(lookup_gpu("A100-SXM-80GB")) == "ampere"
    assert generation(lookup_gpu("B200")) == "blackwell"
    cost = _timing("openai--gpt-oss-20b").cost
    assert cost.weight_format == "mxfp4" and cost.quantized_experts
    assert not cost.quantized_dense  # gpt-oss keeps attention in bf16


def test_generation_constants_cover_gpus_without_their_own() -> None:
    assert {"hopper", "ampere", "ada"} <= set(GENERATION_CALIBRATION)
    assert calibration_source(lookup_gpu("H100-PCIE-80GB")) == "generation"
    assert calibration_source(lookup_gpu("RTX-4090")) == "generation"  # fitted on 4090 runs
    assert calibration_source(lookup_gpu("B200")) == "nearest generation"
    b200 = _timing("Qwen--Qwen3-8B", gpu="B200")  # no Blackwell runs: Hopper's factors
    assert b200.calibration == GENERATION_CALIBRATION["hopper"]
    h200 = _timing("Qwen--Qwen3-8B", gpu="H200")
    assert h200.calibration == GENERATION_CALIBRATION["hopper"]


def test_request_overhead_adds_to_ttft_not_tpot() -> None:
    def run(overhead: float, concurrency: int | None) -> tuple[float, float, float]:
        parts = build_parts(SimEngineConfig(
            model="m", model_config=MODELS / "Qwen--Qwen3-8B", max_model_len=4096,
            calibration=replace(DEFAULT_CALIBRATION, request_overhead_s=overhead)))
        m = parts.memory
        core = EngineCore(KvCapacity(m.num_gpu_blocks, m.block_size, m.max_num_seqs,
                                     m.max_num_batched_tokens), parts.timing)
        items = [WorkItem(synthetic_prompt(200, i), 50) for i in range(6)]
        r = run_workload(core, items, max_concurrency=concurrency)
        return r.mean_ttft_s, r.median_tpot_s, r.duration_s

    base, slow = run(0.0, 1), run(0.05, 1)
    assert abs(slow[0] - base[0] - 0.05) < 1e-9
    assert abs(slow[1] - base[1]) < 1e-12
    # One closed-loop client waits out the overhead of each of its 6 requests.
    assert abs(slow[2] - base[2] - 6 * 0.05) < 1e-9
    burst_base, burst = run(0.0, None), run(0.05, None)
    assert abs(burst[2] - burst_base[2] - 0.05) < 1e-9  # all at once: paid in parallel


def test_poisson_arrivals_are_seeded_and_average_the_rate() -> None:
    from inferplane.sim.offline import _arrival_gaps
    gaps = _arrival_gaps(200, 4.0, seed=0)
    assert gaps == _arrival_gaps(200, 4.0, seed=0)  # the same draw every time
    assert gaps != _arrival_gaps(200, 4.0, seed=1)
    assert sum(gaps) == pytest.approx(200 / 4.0, rel=1e-9)  # one draw's luck does not move the span
    assert max(gaps) > 2 * min(gaps)  # not evenly spaced
    assert _arrival_gaps(5, 2.0, seed=None) == [0.5] * 5
    assert _arrival_gaps(3, None, seed=0) == [0.0] * 3



def test_quantized_experts_and_mla_prefill_have_their_own_factors() -> None:
    base = replace(DEFAULT_CALIBRATION, step_overhead_s=0.0, per_seq_overhead_s=0.0,
                   format_efficiency=(("fp8", 0.5),))
    assert base.moe_format_factor("fp8") == 0.5  # falls back to the dense format's factor
    fp8_moe = _timing("Qwen--Qwen3-235B-A22B-FP8", tp=8)
    assert fp8_moe.cost.quantized_experts and fp8_moe.cost.weight_format == "fp8"
    decode = StepShape(0, 64, 64 * 200, 64 * 200, 64)

    def step(t: StepTimeModel, cal: Calibration, shape: StepShape = decode) -> float:
        return replace(t, calibration=cal).step_time_s(shape)

    slow_experts = replace(base, moe_format_efficiency=(("fp8", 0.25),))
    # Experts are most of the bytes a 64-sequence decode step reads: half their
    # kernels' speed costs nearly half again the step, and the dense fp8 factor is kept.
    assert step(fp8_moe, slow_experts) > 1.6 * step(fp8_moe, base)
    assert slow_experts.format_factor("fp8") == 0.5
    # Dense MLA (DeepSeek-R1): its prefill runs at mla_compute_efficiency; a GQA model
    # ignores it.
    mla = _timing("deepseek-ai--DeepSeek-R1", gpu="H200", tp=8)
    gqa = _timing("Qwen--Qwen3-235B-A22B-FP8", gpu="H200", tp=8)
    assert mla.cost.mla and not gqa.cost.mla
    prefill = StepShape(8192, 0, 8192, 8192 * 4096, 2)
    slow_mla = replace(base, mla_compute_efficiency=0.25)
    assert step(mla, slow_mla, prefill) > 3.0 * step(mla, base, prefill)
    assert step(gqa, slow_mla, prefill) == pytest.approx(step(gqa, base, prefill))


def test_windowed_pairs_match_counting_each_query() -> None:
    from inferplane.sim.scheduler import _windowed_pairs

    for computed, count, window in itertools.product((0, 5, 127, 128, 300), (1, 7, 200),
                                                     (1, 128, 4096)):
        counted = sum(min(pos, window) for pos in range(computed + 1, computed + count + 1))
        assert _windowed_pairs(computed, count, window) == counted


def test_sliding_window_layers_read_their_window_only() -> None:
    # gpt-oss-20b: 12 of 24 layers attend to the last 128 tokens.
    swa = _timing("openai--gpt-oss-20b")
    assert swa.cost.sliding_window == 128 and swa.cost.sliding_fraction == 0.5
    assert _timing("Qwen--Qwen3-8B").cost.sliding_window is None
    cal = replace(DEFAULT_CALIBRATION, step_overhead_s=0.0, per_seq_overhead_s=0.0)
    swa = replace(swa, calibration=cal)
    seqs, context = 64, 8000
    full = StepShape(0, seqs, seqs * context, seqs * context, seqs)
    windowed = replace(full, windowed_context_tokens=seqs * 128,
                       windowed_attention_pairs=seqs * 128)
    kv_s = swa.cost.kv_bytes_per_token * seqs * context / (
        swa.gpu.memory_bandwidth_gbps * 1e9 * cal.bandwidth_efficiency)
    # Half the layers stop at 128 tokens: the step loses almost half the KV read.
    saved = swa.step_time_s(full) - swa.step_time_s(windowed)
    assert saved == pytest.approx(kv_s * 0.5 * (1 - 128 / context), rel=1e-6)
    # Without the windowed sums (a caller that did not compute them) it costs full attention.
    assert swa.step_time_s(full) > swa.step_time_s(windowed)


def test_the_engine_fills_the_windowed_sums_for_a_sliding_window_model() -> None:
    from inferplane.sim.scheduler import SimRequest

    parts = build_parts(SimEngineConfig(model="m", model_config=MODELS / "openai--gpt-oss-20b",
                                        gpu="H100-SXM-80GB", max_model_len=4096))
    m = parts.memory
    core = EngineCore(KvCapacity(m.num_gpu_blocks, m.block_size, m.max_num_seqs,
                                 m.max_num_batched_tokens), parts.timing)
    assert core.scheduler.attention_window == 128
    core.add(SimRequest(request_id="r", prompt_token_ids=synthetic_prompt(1000, 0),
                        output_tokens=20, finish_reason="length", arrival_s=0.0))
    shapes = []
    now = 0.0
    while core.has_work:
        scheduled = core.scheduler.schedule(now)
        shapes.append(scheduled.shape)
        now += parts.timing.step_time_s(scheduled.shape)
        core.scheduler.complete(scheduled, now)
    prefill, decode = shapes[0], shapes[-1]
    assert prefill.attention_pairs == 1000 * 1001 // 2
    assert prefill.windowed_attention_pairs == _pairs_up_to(1000, 128)
    assert decode.context_tokens == 1019 and decode.windowed_context_tokens == 128


def _pairs_up_to(tokens: int, window: int) -> int:
    return sum(min(pos, window) for pos in range(1, tokens + 1))


def test_sparse_mla_has_its_own_prefill_factor() -> None:
    base = GENERATION_CALIBRATION["hopper"]
    dsa = _timing("deepseek-ai--DeepSeek-V3.2", gpu="H200", tp=8)
    dense_mla = _timing("deepseek-ai--DeepSeek-R1", gpu="H200", tp=8)
    assert dsa.cost.sparse_mla and dense_mla.cost.mla and not dense_mla.cost.sparse_mla
    prefill = StepShape(8192, 0, 8192, 8192 * 4096, 2)

    def step(t: StepTimeModel, cal: Calibration) -> float:
        return replace(t, calibration=cal).step_time_s(prefill)

    slow_dsa = replace(base, dsa_compute_efficiency=base.dsa_compute_efficiency / 2)
    assert step(dsa, slow_dsa) > 1.5 * step(dsa, base)
    assert step(dense_mla, slow_dsa) == pytest.approx(step(dense_mla, base))


def test_decode_token_expert_cost_is_per_format_and_decode_only() -> None:
    base = replace(DEFAULT_CALIBRATION, step_overhead_s=0.0, per_seq_overhead_s=0.0,
                   moe_kernel_efficiency=0.5, moe_format_efficiency=(("fp8", 0.4),))
    bf16 = _timing("Qwen--Qwen3-235B-A22B", tp=8)
    fp8 = _timing("Qwen--Qwen3-235B-A22B-FP8", tp=8)
    dense = _timing("Qwen--Qwen3-8B")
    rate = 20.0
    per_format = replace(base, moe_decode_token_rate=(("bf16", rate),))

    def step(t: StepTimeModel, cal: Calibration, shape: StepShape) -> float:
        return replace(t, calibration=cal).step_time_s(shape)

    for seqs in (1, 64, 512):
        decode = StepShape(0, seqs, seqs * 200, seqs * 200, seqs)
        timed = replace(bf16, calibration=per_format)
        bandwidth = bf16.gpu.memory_bandwidth_gbps * 1e9 * base.bandwidth_efficiency
        c = bf16.cost
        # Each decode token: its top-k experts' bytes at `rate` x the expert bandwidth.
        expected = seqs * c.expert_bytes * c.experts_per_token / c.num_experts / (
            bandwidth * base.moe_kernel_efficiency * rate)
        assert timed.expert_token_s(seqs, bandwidth) == pytest.approx(expected)
        assert step(bf16, per_format, decode) - step(bf16, base, decode) == pytest.approx(
            expected)
        # fp8 experts and a dense model have no rate of their own: unchanged.
        assert step(fp8, per_format, decode) == step(fp8, base, decode)
        assert step(dense, per_format, decode) == step(dense, base, decode)
    # Prompt tokens pay nothing: a prefill-only step is the same with or without it.
    prefill = StepShape(512, 0, 512, 512 * 256, 1)
    assert step(bf16, per_format, prefill) == step(bf16, base, prefill)
    assert replace(bf16, calibration=per_format).expert_token_s(0, 1e12) == 0.0
