"""Normalise a decoder's text config into one shape (`TextArch`) across model families.

Each family names the same facts differently (`num_local_experts` / `num_experts` /
`n_routed_experts`, ...) and differs in small structural details (biases, extra norms,
attention sinks) that change the exact parameter count. This module records both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inferplane.errors import InferplaneError

MLA_FAMILIES = frozenset({"deepseek_v2", "deepseek_v3", "deepseek_v32"})
# MLA with DeepSeek Sparse Attention (a lightning indexer picks the top-k earlier tokens
# each query attends to): vLLM runs it through other kernels than dense MLA.
SPARSE_MLA_FAMILIES = frozenset({"deepseek_v32"})
KNOWN_FAMILIES = frozenset(
    {"llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gemma2", "gemma3_text",
     "gpt_oss"}
) | MLA_FAMILIES


@dataclass(frozen=True)
class TextArch:
    """Structural facts of one decoder, enough to count parameters and KV bytes."""

    model_type: str
    known: bool  # False: generic llama-like fallback
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    vocab_size: int
    dense_intermediate: int  # width of dense MLP layers
    tie_word_embeddings: bool
    norms_per_layer: int  # hidden-size norms per decoder layer
    qkv_bias: bool
    o_bias: bool
    qk_norm: bool  # per-head q_norm/k_norm (Qwen3, Gemma-3)
    attention_sinks: bool  # one learned sink per head (gpt-oss)
    mlp_bias: bool
    # MLA
    q_lora_rank: int | None
    kv_lora_rank: int | None
    qk_rope_head_dim: int | None
    qk_nope_head_dim: int | None
    # MoE
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate: int
    num_shared_experts: int
    moe_layers: tuple[bool, ...]  # True where layer i is a MoE layer
    router_bias: bool
    expert_bias: bool  # per-expert biases on gate_up/down (gpt-oss)
    score_correction_bias: bool  # DeepSeek-V3 `noaux_tc` router bias

    @property
    def uses_mla(self) -> bool:
        return self.kv_lora_rank is not None


def _int(cfg: dict[str, Any], key: str, *, location: str) -> int:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InferplaneError(
            "missing or not a non-negative integer in config.json",
            field=key,
            value=value,
            location=location,
            fix=f"use the checkpoint's original config.json, which sets `{key}`",
        )
    return value


def _opt_int(cfg: dict[str, Any], key: str) -> int | None:
    value = cfg.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _first_int(cfg: dict[str, Any], *keys: str) -> int:
    for key in keys:
        value = _opt_int(cfg, key)
        if value is not None:
            return value
    return 0


def build_arch(cfg: dict[str, Any], *, location: str) -> TextArch:
    """Build a `TextArch` from a text config that already has family defaults applied."""
    model_type = str(cfg.get("model_type", ""))
    hidden = _int(cfg, "hidden_size", location=location)
    layers = _int(cfg, "num_hidden_layers", location=location)
    heads = _int(cfg, "num_attention_heads", location=location)
    vocab = _int(cfg, "vocab_size", location=location)
    kv_heads = _opt_int(cfg, "num_key_value_heads") or heads
    if heads == 0 or hidden == 0:
        raise InferplaneError(
            "hidden_size and num_attention_heads must be positive",
            value={"hidden_size": hidden, "num_attention_heads": heads},
            location=location,
            fix="use the checkpoint's original config.json",
        )
    is_mla = model_type in MLA_FAMILIES
    head_dim = _opt_int(cfg, "head_dim") or hidden // heads
    v_head_dim = head_dim
    q_lora = kv_lora = rope_dim = nope_dim = None
    if is_mla:
        q_lora = _opt_int(cfg, "q_lora_rank")  # None in V2-Lite: a plain q_proj
        kv_lora = _int(cfg, "kv_lora_rank", location=location)
        rope_dim = _int(cfg, "qk_rope_head_dim", location=location)
        nope_dim = _int(cfg, "qk_nope_head_dim", location=location)
        head_dim = rope_dim + nope_dim
        v_head_dim = _int(cfg, "v_head_dim", location=location)

    intermediate = _opt_int(cfg, "intermediate_size") or 0
    attention_bias = bool(cfg.get("attention_bias", False))
    moe = _moe_layout(cfg, model_type, layers, intermediate)
    return TextArch(
        model_type=model_type,
        known=model_type in KNOWN_FAMILIES,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        v_head_dim=v_head_dim,
        vocab_size=vocab,
        dense_intermediate=intermediate,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        # Gemma-2/3 add pre- and post-feedforward norms to the usual two.
        norms_per_layer=4 if model_type in ("gemma2", "gemma3_text") else 2,
        # Qwen2 always has q/k/v biases (no config key); others follow `attention_bias`.
        qkv_bias=True if model_type == "qwen2" else attention_bias,
        o_bias=False if model_type == "qwen2" else attention_bias,
        qk_norm=model_type in ("qwen3", "qwen3_moe", "gemma3_text"),
        attention_sinks=model_type == "gpt_oss",
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        q_lora_rank=q_lora,
        kv_lora_rank=kv_lora,
        qk_rope_head_dim=rope_dim,
        qk_nope_head_dim=nope_dim,
        router_bias=model_type == "gpt_oss",
        expert_bias=model_type == "gpt_oss",
        score_correction_bias=is_mla and cfg.get("topk_method") == "noaux_tc",
        **moe,
    )


def _moe_layout(
    cfg: dict[str, Any], model_type: str, layers: int, intermediate: int
) -> dict[str, Any]:
    """Experts, their width and which layers are MoE, by each family's rule."""
    num_experts = _first_int(cfg, "num_local_experts", "num_experts", "n_routed_experts")
    per_tok = _first_int(cfg, "num_experts_per_tok", "experts_per_token")
    shared = _opt_int(cfg, "n_shared_experts") or 0
    if num_experts == 0:
        return {"num_experts": 0, "num_experts_per_tok": 0, "moe_intermediate": 0,
                "num_shared_experts": 0, "moe_layers": (False,) * layers}
    if model_type in MLA_FAMILIES:
        first_dense = _opt_int(cfg, "first_k_dense_replace") or 0
        freq = _opt_int(cfg, "moe_layer_freq") or 1
        flags = tuple(i >= first_dense and i % freq == 0 for i in range(layers))
        width = _opt_int(cfg, "moe_intermediate_size") or intermediate
    elif model_type == "qwen3_moe" or "decoder_sparse_step" in cfg:
        step = _opt_int(cfg, "decoder_sparse_step") or 1
        dense_only = set(cfg.get("mlp_only_layers") or [])
        flags = tuple(i not in dense_only and (i + 1) % step == 0 for i in range(layers))
        width = _opt_int(cfg, "moe_intermediate_size") or intermediate
    else:
        # Mixtral, gpt-oss and unknown MoEs: every layer is MoE, experts use intermediate_size
        # unless a separate moe_intermediate_size is given.
        flags = (True,) * layers
        width = _opt_int(cfg, "moe_intermediate_size") or intermediate
    return {"num_experts": num_experts, "num_experts_per_tok": per_tok,
            "moe_intermediate": width, "num_shared_experts": shared, "moe_layers": flags}
