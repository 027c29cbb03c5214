"""The LoRA reservation (estimator/lora.py): every stacked A/B tensor vLLM 0.32 allocates,
counted one by one, equals the formula; the KV cache gives up exactly the reservation."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferplane.errors import InferplaneError
from inferplane.estimator.lora import (
    LoraSlots,
    reservation_bytes,
    shrink_buffer_bytes,
    wrapped_modules,
)
from inferplane.estimator.memory import estimate_memory
from inferplane.estimator.types import EngineSettings
from inferplane.gpus import find_gpu
from inferplane.models import load_profile
from inferplane.models.profile import ModelProfile
from inferplane.spec.lora import VLLM_LORA_RANKS

MODELS = "tests/data/models/"
LLAMA = load_profile(MODELS + "meta-llama--Llama-3.1-8B-Instruct")
QWEN_MOE = load_profile(MODELS + "Qwen--Qwen3-30B-A3B")


def _vllm_tensors(p: ModelProfile, tp: int, slots: int, r: int) -> list[tuple[int, ...]]:
    """The shapes `create_lora_weights` allocates, layer by layer (vllm/lora/layers, 0.32)."""
    shapes: list[tuple[int, ...]] = []
    hd = p.head_dim
    q = p.num_attention_heads * hd // tp
    kv = max(1, p.num_kv_heads // tp) * hd
    for layer in range(p.num_layers):
        # MergedQKVParallelLinearWithLoRA: three slices, A over the full input
        shapes += [(slots, 1, r, p.hidden_size)] * 3
        shapes += [(slots, 1, q, r), (slots, 1, kv, r), (slots, 1, kv, r)]
        # RowParallelLinearWithLoRA o_proj: input split
        shapes += [(slots, 1, r, q), (slots, 1, p.hidden_size, r)]
        if p.is_moe and layer < p.num_moe_layers:
            e, i = p.num_experts, p.moe_intermediate_size // tp
            shapes += [(slots, 1, r, p.hidden_size), (slots, 1, e, r)]  # router (replicated)
            shapes += [(slots, e, r, p.hidden_size)] * 2 + [(slots, e, i, r)] * 2  # w1, w3
            shapes += [(slots, e, r, i), (slots, e, p.hidden_size, r)]  # w2
        else:
            i = p.intermediate_size // tp
            shapes += [(slots, 1, r, p.hidden_size)] * 2 + [(slots, 1, i, r)] * 2
            shapes += [(slots, 1, r, i), (slots, 1, p.hidden_size, r)]
    if p.architecture in ("LlamaForCausalLM", "Qwen3MoeForCausalLM"):
        shapes += [(slots, p.vocab_size, r), (slots, 1, p.hidden_size, r)]  # embedding
        shapes += [(slots, 1, r, p.hidden_size), (slots, 1, p.vocab_size, r)]  # logits
    return shapes


@settings(max_examples=60, deadline=None)
@given(
    layers=st.integers(1, 6), heads_per_kv=st.sampled_from([1, 2, 4, 8]),
    kv_heads=st.sampled_from([1, 2, 4, 8]), head_dim=st.sampled_from([32, 64, 128]),
    inter=st.sampled_from([256, 1024, 4096]), vocab=st.integers(100, 5000),
    tp=st.sampled_from([1, 2, 4, 8]), slots=st.integers(1, 16),
    rank=st.sampled_from(VLLM_LORA_RANKS), arch=st.sampled_from(["LlamaForCausalLM",
                                                                  "Qwen2ForCausalLM"]),
    dtype_bytes=st.sampled_from([2, 4]),
)
def test_the_formula_is_every_tensor_counted(
    layers: int, heads_per_kv: int, kv_heads: int, head_dim: int, inter: int, vocab: int,
    tp: int, slots: int, rank: int, arch: str, dtype_bytes: int,
) -> None:
    heads = kv_heads * heads_per_kv
    if heads % tp or inter % tp:
        return
    p = replace(LLAMA, architecture=arch, num_layers=layers, num_attention_heads=heads,
                num_kv_heads=kv_heads, head_dim=head_dim, hidden_size=heads * head_dim,
                intermediate_size=inter, vocab_size=vocab)
    expected = sum(math.prod(s) for s in _vllm_tensors(p, tp, slots, rank)) * dtype_bytes
    got = reservation_bytes(wrapped_modules(p, tp), LoraSlots(slots, rank), dtype_bytes)
    assert got == expected


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_moe_experts_and_router_are_counted(tp: int) -> None:
    expected = sum(math.prod(s) for s in _vllm_tensors(QWEN_MOE, tp, 2, 8)) * 2
    got = reservation_bytes(wrapped_modules(QWEN_MOE, tp), LoraSlots(2, 8), 2)
    assert got == expected


def test_llama_8b_by_hand() -> None:
    # per layer at rank 1: qkv 3*4096 + (4096+1024+1024), o 4096+4096,
    # gate_up 2*4096 + 2*14336, down 14336+4096 = 81,920; embedding and LM head each
    # 128,256 + 4,096. One slot at rank 16 in bf16:
    per_rank = 32 * 81_920 + 2 * (128_256 + 4_096)
    assert reservation_bytes(wrapped_modules(LLAMA, 1), LoraSlots(1, 16), 2) == \
        per_rank * 16 * 2 == 92_356_608


def test_the_kv_cache_gives_up_exactly_the_reservation() -> None:
    gpu = find_gpu("H100-SXM-80GB")
    base = EngineSettings(max_model_len=8192, vllm_version="0.32.0")
    slots = LoraSlots(max_loras=4, max_lora_rank=64)
    plain = estimate_memory(LLAMA, base, gpu=gpu)
    lora = estimate_memory(LLAMA, replace(base, lora=slots), gpu=gpu)
    modules = wrapped_modules(LLAMA, 1)
    reserved = reservation_bytes(modules, slots, 2)
    shrink = shrink_buffer_bytes(modules, slots, plain.max_num_batched_tokens)
    assert lora.lora_gib == pytest.approx(reserved / 2**30, abs=1e-4)
    assert plain.kv_cache_gib - lora.kv_cache_gib == pytest.approx(
        (reserved + shrink) / 2**30, abs=2e-4)
    assert lora.weights_gib == plain.weights_gib  # the model's own weights are unchanged
    assert lora.kv_cache_tokens < plain.kv_cache_tokens


def test_pipeline_stages_hold_their_own_layers_embedding_and_head() -> None:
    gpu = find_gpu("L40S")
    slots = LoraSlots(2, 16)
    est = estimate_memory(
        LLAMA, EngineSettings(max_model_len=4096, pipeline_parallel_size=2, lora=slots),
        gpu=gpu)
    first, last = est.ranks
    half = reservation_bytes(wrapped_modules(LLAMA, 1, num_layers=16, last_stage=False),
                             slots, 2)
    assert first.lora_gib == pytest.approx(half / 2**30, abs=1e-4)
    assert last.lora_gib > 0 and first.lora_gib + last.lora_gib == pytest.approx(
        reservation_bytes(wrapped_modules(LLAMA, 1), slots, 2) / 2**30, abs=2e-4)


def test_unmodelled_architectures_are_refused_with_the_field() -> None:
    mla = load_profile(MODELS + "deepseek-ai--DeepSeek-V3")
    with pytest.raises(InferplaneError, match="multi-head latent attention") as caught:
        wrapped_modules(mla, 8)
    assert caught.value.field == "lora"


def test_estimate_prints_the_lora_line_and_refuses_odd_ranks() -> None:
    from typer.testing import CliRunner

    from inferplane.cli.main import _register_commands, app

    _register_commands()
    model = MODELS + "meta-llama--Llama-3.1-8B-Instruct"
    shown = CliRunner().invoke(app, ["estimate", model, "--gpu", "H100-SXM-80GB",
                                     "--max-model-len", "8192", "--max-loras", "4",
                                     "--max-lora-rank", "64"], env={"COLUMNS": "120"})
    assert shown.exit_code == 0, shown.output
    assert "LoRA adapter slots" in shown.output and "1.38 GiB" in shown.output
    odd = CliRunner().invoke(app, ["estimate", model, "--gpu", "H100-SXM-80GB",
                                   "--max-lora-rank", "7"])
    # the CLI's entry point turns this into exit 2 with the message (cli/main.py)
    assert isinstance(odd.exception, InferplaneError)
    assert odd.exception.field == "--max-lora-rank"
