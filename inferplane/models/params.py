"""Parameter counts by role, computed from the architecture when no weights are present.

Each rule mirrors the modules vLLM builds for the family (see docs/models.md). Counts are of
logical parameters (unquantized elements), so they match published model sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inferplane.models.arch import TextArch
from inferplane.models.profile import ParamCounts


@dataclass
class _Tally:
    embedding: int = 0
    lm_head: int = 0
    linear: int = 0
    experts: int = 0
    other: int = 0

    def freeze(self) -> ParamCounts:
        return ParamCounts(self.embedding, self.lm_head, self.linear, self.experts, self.other)


def count_text_params(arch: TextArch) -> ParamCounts:
    """Parameters of the decoder: embeddings, layers, final norm and lm_head."""
    t = _Tally()
    t.embedding = arch.vocab_size * arch.hidden_size
    t.lm_head = 0 if arch.tie_word_embeddings else arch.vocab_size * arch.hidden_size
    t.other += arch.hidden_size  # final norm
    for layer in range(arch.num_layers):
        if arch.uses_mla:
            _add_mla_attention(t, arch)
        else:
            _add_gqa_attention(t, arch)
        t.other += arch.norms_per_layer * arch.hidden_size
        if arch.moe_layers[layer]:
            _add_moe(t, arch)
        else:
            _add_dense_mlp(t, arch.hidden_size, arch.dense_intermediate, bias=arch.mlp_bias)
    return t.freeze()


def _add_gqa_attention(t: _Tally, a: TextArch) -> None:
    q_out = a.num_heads * a.head_dim
    kv_out = a.num_kv_heads * a.head_dim
    t.linear += a.hidden_size * (q_out + 2 * kv_out) + q_out * a.hidden_size
    if a.qkv_bias:
        t.other += q_out + 2 * kv_out
    if a.o_bias:
        t.other += a.hidden_size
    if a.qk_norm:
        t.other += 2 * a.head_dim
    if a.attention_sinks:
        t.other += a.num_heads


def _add_mla_attention(t: _Tally, a: TextArch) -> None:
    assert a.kv_lora_rank is not None and a.qk_rope_head_dim is not None
    h = a.hidden_size
    q_out = a.num_heads * a.head_dim  # head_dim = nope + rope
    if a.q_lora_rank is None:
        t.linear += h * q_out  # q_proj
    else:
        t.linear += h * a.q_lora_rank + a.q_lora_rank * q_out  # q_a_proj, q_b_proj
        t.other += a.q_lora_rank  # q_a_layernorm
    assert a.qk_nope_head_dim is not None
    t.linear += h * (a.kv_lora_rank + a.qk_rope_head_dim)  # kv_a_proj_with_mqa
    t.other += a.kv_lora_rank  # kv_a_layernorm
    t.linear += a.kv_lora_rank * a.num_heads * (a.qk_nope_head_dim + a.v_head_dim)  # kv_b_proj
    t.linear += a.num_heads * a.v_head_dim * h  # o_proj


def _add_dense_mlp(t: _Tally, hidden: int, width: int, *, bias: bool) -> None:
    t.linear += 3 * hidden * width  # gate, up, down
    if bias:
        t.other += 2 * width + hidden


def _add_moe(t: _Tally, a: TextArch) -> None:
    h, e, w = a.hidden_size, a.num_experts, a.moe_intermediate
    t.other += h * e  # router gate
    if a.router_bias:
        t.other += e
    if a.score_correction_bias:
        t.other += e
    t.experts += e * 3 * h * w
    if a.expert_bias:
        t.other += e * (2 * w + h)
    if a.num_shared_experts:
        # Shared experts are one dense MLP of n_shared x width, active for every token.
        _add_dense_mlp(t, h, a.num_shared_experts * w, bias=False)


def count_gemma3_vision_params(vision: dict[str, Any], text_hidden: int) -> int:
    """SigLIP vision tower + Gemma-3 projector, which vLLM loads with the language model."""
    h = int(vision["hidden_size"])
    inter = int(vision["intermediate_size"])
    layers = int(vision["num_hidden_layers"])
    patch = int(vision["patch_size"])
    channels = int(vision["num_channels"])
    patches = (int(vision["image_size"]) // patch) ** 2
    total = channels * patch * patch * h + h  # patch conv weight + bias
    total += patches * h  # position embedding
    per_layer = 4 * (h * h + h)  # q, k, v, out with biases
    per_layer += 2 * 2 * h  # two LayerNorms (weight + bias)
    per_layer += (h * inter + inter) + (inter * h + h)  # fc1, fc2
    total += layers * per_layer
    total += 2 * h  # post_layernorm
    if vision.get("vision_use_head", True):
        # Attention-pooling head: probe, nn.MultiheadAttention, LayerNorm, MLP.
        total += h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h
        total += (h * inter + inter) + (inter * h + h)
    # Gemma3MultiModalProjector: soft-embedding RMSNorm + input projection matrix.
    total += h + h * text_hidden
    return total
