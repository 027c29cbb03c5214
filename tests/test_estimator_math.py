"""The estimator's arithmetic on hand-built profiles: every expected number is computed by
hand here from vLLM's formulas, independent of the model loader."""

from __future__ import annotations

import dataclasses
import math

import pytest

from inferplane.estimator import rules
from inferplane.estimator.memory import AUTO_MAX_MODEL_LEN, estimate_memory
from inferplane.estimator.rules import valid_tp_sizes
from inferplane.estimator.types import EngineSettings
from inferplane.gpus.spec import GIB, GpuSpec
from inferplane.models.profile import ModelProfile, ParamCounts, QuantizationInfo

H100 = GpuSpec(
    name="H100-SXM-80GB", total_memory_bytes=int(79.19 * GIB), memory_bandwidth_gbps=3350,
    bf16_tflops=989, fp8_tflops=1979, compute_capability=(9, 0), interconnect="nvlink",
    interconnect_bandwidth_gbps=900,
)
V100 = dataclasses.replace(
    H100, name="V100-32GB", compute_capability=(7, 0), fp8_tflops=None,
    total_memory_bytes=int(31.74 * GIB),
)


def gqa_profile(**overrides: object) -> ModelProfile:
    """Qwen3-14B's shape: 40 layers, 40 heads, 8 KV heads, head_dim 128."""
    base = ModelProfile(
        name="qwen3-14b-like", architecture="Qwen3ForCausalLM", model_type="qwen3",
        num_layers=40, hidden_size=5120, num_attention_heads=40, num_kv_heads=8, head_dim=128,
        vocab_size=151936, intermediate_size=17408, max_position_embeddings=40960,
        torch_dtype="bfloat16", tie_word_embeddings=False, layer_attention=("full",) * 40,
        params=ParamCounts(
            embedding=151936 * 5120, lm_head=151936 * 5120, linear=13_000_000_000,
            experts=0, other=1_000_000,
        ),
    )
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]


def test_kv_bytes_per_token_gqa() -> None:
    est = estimate_memory(gqa_profile(), EngineSettings(max_model_len=32768), gpu=H100)
    assert est.kv_bytes_per_token == 40 * 2 * 8 * 128 * 2 == 163_840
    assert est.kv_bytes_per_token_per_gpu == 163_840


def test_kv_bytes_per_token_split_by_tp_and_fp8() -> None:
    settings = EngineSettings(tensor_parallel_size=4, kv_cache_dtype="fp8", max_model_len=8192)
    est = estimate_memory(gqa_profile(), settings, gpu=H100)
    assert est.kv_bytes_per_token == 40 * 2 * 8 * 128 * 1
    assert est.kv_bytes_per_token_per_gpu == 40 * 2 * 2 * 128 * 1


def test_kv_heads_replicated_when_tp_exceeds_them() -> None:
    profile = gqa_profile(num_kv_heads=4)
    est = estimate_memory(profile, EngineSettings(tensor_parallel_size=8, max_model_len=4096),
                          gpu=H100)
    assert est.kv_bytes_per_token_per_gpu == 40 * 2 * 1 * 128 * 2
    assert any("replicated" in w for w in est.warnings)


def test_research_worked_example_blocks_tokens_concurrency() -> None:
    # ../shared/research/vllm-memory.md §4: 6.51 GiB / 163,840 B -> 2,666 blocks, 1.30x at 32K.
    settings = EngineSettings(max_model_len=32768, kv_cache_memory_bytes=int(6.51 * GIB))
    est = estimate_memory(gqa_profile(), settings, gpu=H100)
    assert est.num_gpu_blocks == 2666
    assert est.max_concurrency == pytest.approx(1.30, abs=0.005)
    assert est.kv_cache_tokens == 42_656


def test_mla_latent_is_not_split_and_has_no_kv_pair() -> None:
    profile = gqa_profile(
        num_layers=61, layer_attention=("mla",) * 61, num_attention_heads=128,
        num_kv_heads=128, head_dim=192, v_head_dim=128, kv_lora_rank=512, q_lora_rank=1536,
        qk_rope_head_dim=64, qk_nope_head_dim=128, hidden_size=7168,
    )
    settings = EngineSettings(tensor_parallel_size=8, max_model_len=16384)
    est = estimate_memory(profile, settings, gpu=H100)
    assert est.kv_bytes_per_token == 61 * 576 * 2 == 70_272
    assert est.kv_bytes_per_token_per_gpu == 70_272
    assert est.block_size == 64  # FlashMLA on Hopper


def test_hybrid_sliding_window_groups_and_concurrency() -> None:
    # Gemma-3-like: 5 sliding layers per full one, 12 layers -> 2 full, 10 sliding.
    pattern = tuple("full" if (i + 1) % 6 == 0 else "sliding" for i in range(12))
    profile = gqa_profile(num_layers=12, layer_attention=pattern, sliding_window=1024)
    kv_bytes = int(1 * GIB)
    settings = EngineSettings(
        max_model_len=32768, max_num_batched_tokens=2048, kv_cache_memory_bytes=kv_bytes
    )
    est = estimate_memory(profile, settings, gpu=H100)
    page = 16 * 8 * 256 * 2  # block x kv heads x (k+v dims) x bf16
    group_size = 2  # min(2, 10): 10 >= 1.5 x 2
    assert est.num_gpu_blocks == kv_bytes // (page * group_size)
    full_blocks = math.ceil(32768 / 16)
    sliding_blocks = math.ceil((1024 - 1 + 2048) / 16) + 1
    per_request = 1 * full_blocks + 5 * sliding_blocks  # 1 full group, 5 sliding groups
    assert est.max_concurrency == pytest.approx(est.num_gpu_blocks / per_request, abs=0.005)


def test_weights_bf16_are_params_times_two_plus_rope_table() -> None:
    profile = gqa_profile()
    est = estimate_memory(profile, EngineSettings(max_model_len=8192), gpu=H100)
    expected = profile.params.total * 2 + 40960 * 128 * 2
    assert est.weights_gib == pytest.approx(expected / GIB, abs=1e-4)


def test_weights_shard_with_tp() -> None:
    profile = gqa_profile()
    one = estimate_memory(profile, EngineSettings(max_model_len=8192), gpu=H100)
    four = estimate_memory(
        profile, EngineSettings(max_model_len=8192, tensor_parallel_size=4), gpu=H100
    )
    # Norms and the rope table are replicated, the rest splits four ways.
    assert four.weights_gib == pytest.approx(one.weights_gib / 4, rel=0.01)
    assert four.weights_gib > one.weights_gib / 4


def test_awq_weights_and_bf16_refusal() -> None:
    awq = QuantizationInfo(method="awq", weight_bits=4, group_size=128)
    profile = gqa_profile(quantization=awq, torch_dtype="float16")
    est = estimate_memory(profile, EngineSettings(max_model_len=8192), gpu=H100)
    p = profile.params
    linear_rate = 0.5 + (2 + 0.5) / 128
    expected = (p.embedding + p.lm_head + p.other) * 2 + p.linear * linear_rate + 40960 * 128 * 2
    assert est.weights_gib == pytest.approx(expected / GIB, abs=1e-4)
    assert est.fits
    refused = estimate_memory(
        profile, EngineSettings(max_model_len=8192, quantization="awq", dtype="bfloat16"),
        gpu=H100,
    )
    assert not refused.fits
    assert any("AWQ" in e and "float16" in e for e in refused.errors)


def test_moe_loads_every_expert() -> None:
    dense = gqa_profile()
    moe = gqa_profile(
        params=dataclasses.replace(dense.params, experts=20_000_000_000),
        num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
    )
    a = estimate_memory(dense, EngineSettings(max_model_len=4096), gpu=H100)
    b = estimate_memory(moe, EngineSettings(max_model_len=4096), gpu=H100)
    assert b.weights_gib - a.weights_gib == pytest.approx(20e9 * 2 / GIB, abs=1e-3)


def test_tp_must_divide_heads_and_lists_valid_sizes() -> None:
    profile = gqa_profile(num_attention_heads=28, num_kv_heads=4)  # Qwen2.5-7B's heads
    assert valid_tp_sizes(profile) == [1, 2, 4, 28]
    est = estimate_memory(
        profile, EngineSettings(tensor_parallel_size=3, max_model_len=4096), gpu=H100
    )
    assert not est.fits
    assert any(e.startswith("P11") and "1, 2, 4, 28" in e for e in est.errors)


def test_max_model_len_auto_fits_the_pool() -> None:
    settings = EngineSettings(max_model_len=AUTO_MAX_MODEL_LEN, kv_cache_memory_bytes=GIB)
    est = estimate_memory(gqa_profile(), settings, gpu=H100)
    # 1 GiB / 163,840 B = 6553 tokens -> 409 whole blocks of 16 = 6544 tokens.
    assert est.max_model_len == 409 * 16
    assert est.fits


def test_too_long_for_pool_is_p02_error_with_largest_length() -> None:
    settings = EngineSettings(max_model_len=32768, kv_cache_memory_bytes=GIB)
    est = estimate_memory(gqa_profile(), settings, gpu=H100)
    assert not est.fits
    assert any(e.startswith("P02") and "6544" in e for e in est.errors)


def test_max_model_len_above_model_maximum_is_refused() -> None:
    est = estimate_memory(gqa_profile(), EngineSettings(max_model_len=131072), gpu=H100)
    assert any("exceeds the model's maximum of 40960" in e for e in est.errors)


def test_default_max_model_len_warns_p02() -> None:
    est = estimate_memory(gqa_profile(), EngineSettings(), gpu=H100)
    assert est.max_model_len == 40960
    assert any(w.startswith("P02") for w in est.warnings)


def test_enforce_eager_drops_graphs_and_warns() -> None:
    eager = estimate_memory(
        gqa_profile(), EngineSettings(max_model_len=8192, enforce_eager=True), gpu=H100
    )
    graphs = estimate_memory(gqa_profile(), EngineSettings(max_model_len=8192), gpu=H100)
    assert eager.cuda_graph_gib == 0
    assert any(w.startswith("P33") for w in eager.warnings)
    # Since vLLM 0.21 graph memory comes out of the KV budget.
    assert eager.kv_cache_gib == pytest.approx(graphs.kv_cache_gib + graphs.cuda_graph_gib,
                                               abs=1e-3)


def test_graphs_outside_budget_before_0_21() -> None:
    old = estimate_memory(
        gqa_profile(), EngineSettings(max_model_len=8192, vllm_version="0.10.1"), gpu=H100
    )
    eager = estimate_memory(
        gqa_profile(),
        EngineSettings(max_model_len=8192, vllm_version="0.10.1", enforce_eager=True),
        gpu=H100,
    )
    assert not old.cuda_graph_in_budget
    assert old.kv_cache_gib == pytest.approx(eager.kv_cache_gib, abs=1e-4)


def test_utilization_budget_formula() -> None:
    settings = EngineSettings(max_model_len=8192, gpu_memory_utilization=0.8)
    est = estimate_memory(gqa_profile(), settings, gpu=H100)
    budget = est.requested_memory_gib
    spent = est.weights_gib + est.activation_gib + est.non_torch_gib + est.cuda_graph_gib
    assert est.kv_cache_gib == pytest.approx(budget - spent, abs=1e-3)
    assert budget == pytest.approx(0.8 * 79.19, abs=1e-3)


def test_fp8_on_pre_ampere_gpu_is_an_error_and_on_ampere_a_warning() -> None:
    fp8 = QuantizationInfo(method="fp8", weight_bits=8)
    profile = gqa_profile(quantization=fp8)
    est = estimate_memory(profile, EngineSettings(max_model_len=4096), gpu=V100)
    assert any("FP8" in e for e in est.errors)
    a100 = dataclasses.replace(H100, name="A100-80GB", compute_capability=(8, 0), fp8_tflops=None)
    est = estimate_memory(profile, EngineSettings(max_model_len=4096), gpu=a100)
    assert est.fits or not any("FP8" in e for e in est.errors)
    assert any("Marlin" in w for w in est.warnings)


def test_high_utilization_warns_p06() -> None:
    est = estimate_memory(
        gqa_profile(), EngineSettings(max_model_len=4096, gpu_memory_utilization=0.95), gpu=H100
    )
    assert any(w.startswith("P06") for w in est.warnings)


def test_vllm_default_utilization_warns_only_with_a_reason_of_the_model() -> None:
    """Issue 28/15: vLLM 0.21+ defaults to 0.92, above the generic 0.90 band; an estimate
    at that default says nothing, unless the model needs the lower band (FP8, 30B+)."""
    at_default = EngineSettings(max_model_len=4096, gpu_memory_utilization=0.92,
                                vllm_version="0.21.0")
    est = estimate_memory(gqa_profile(), at_default, gpu=H100)
    assert not any(w.startswith("P06") for w in est.warnings), est.warnings
    old = dataclasses.replace(at_default, vllm_version="0.10.2")  # default there is 0.90
    assert any(w.startswith("P06") for w in estimate_memory(gqa_profile(), old,
                                                             gpu=H100).warnings)
    big_fp8 = rules.utilization_warnings(0.92, True, 70_000_000_000, vllm_default=0.92)
    assert big_fp8 and "30B+" in big_fp8[0]


def test_weights_larger_than_budget_do_not_fit() -> None:
    small = dataclasses.replace(H100, total_memory_bytes=16 * GIB)
    est = estimate_memory(gqa_profile(), EngineSettings(max_model_len=4096), gpu=small)
    assert not est.fits
    assert any("weights need" in e for e in est.errors)
