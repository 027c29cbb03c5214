"""Default values of transformers' config classes, for keys a config.json may leave out.

Published configs are sparse: transformers fills the gaps from the `__init__` defaults of the
config class named by `model_type`, and vLLM reads the filled-in object. Gemma-3 is the
classic case (its `text_config` has no `vocab_size`, `max_position_embeddings`, ...).
Only keys that `inferplane.models` reads are listed. Source: `configuration_<family>.py`
in huggingface/transformers (4.5x), checked key by key.
"""

from __future__ import annotations

from typing import Any

# Keys every PretrainedConfig has, whatever the family.
BASE_DEFAULTS: dict[str, Any] = {
    "tie_word_embeddings": True,
}

FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {
        "tie_word_embeddings": False,
        "max_position_embeddings": 2048,
        "attention_bias": False,
        "mlp_bias": False,
    },
    "mistral": {
        "tie_word_embeddings": False,
        "max_position_embeddings": 4096 * 32,
        "sliding_window": 4096,
    },
    "mixtral": {
        "tie_word_embeddings": False,
        "max_position_embeddings": 4096 * 32,
        "sliding_window": None,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    },
    "qwen2": {
        "tie_word_embeddings": False,
        "max_position_embeddings": 32768,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 28,
    },
    "qwen3": {
        "tie_word_embeddings": False,
        "max_position_embeddings": 32768,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 28,
        "attention_bias": False,
        "head_dim": 128,
    },
    "qwen3_moe": {
        "tie_word_embeddings": False,
        "max_position_embeddings": 32768,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 28,
        "attention_bias": False,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
    },
    "deepseek_v2": {
        "tie_word_embeddings": False,
        "max_position_embeddings": 2048,
        "first_k_dense_replace": 0,
        "moe_layer_freq": 1,
        "n_shared_experts": None,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "topk_method": "greedy",
    },
    "deepseek_v3": {
        "tie_word_embeddings": False,
        "max_position_embeddings": 4096,
        "first_k_dense_replace": 3,
        "moe_layer_freq": 1,
        "n_shared_experts": 1,
        "n_routed_experts": 256,
        "num_experts_per_tok": 8,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "topk_method": "noaux_tc",
    },
    "gemma2": {
        "tie_word_embeddings": True,
        "vocab_size": 256000,
        "max_position_embeddings": 8192,
        "head_dim": 256,
        "sliding_window": 4096,
    },
    # Gemma3TextConfig.__init__ defaults (transformers 4.50+).
    "gemma3_text": {
        "tie_word_embeddings": True,
        "vocab_size": 262_208,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 131_072,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "attention_bias": False,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
        "rope_scaling": None,
    },
    "gpt_oss": {
        "tie_word_embeddings": False,
        "attention_bias": True,
        "sliding_window": 128,
        "max_position_embeddings": 131072,
    },
    # SiglipVisionConfig.__init__ defaults (the vision tower of Gemma-3).
    "siglip_vision_model": {
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "num_channels": 3,
        "image_size": 224,
        "patch_size": 16,
        "vision_use_head": True,
    },
}


def with_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """Return `config` with its family's missing keys filled in (keys set to null stay null)."""
    model_type = str(config.get("model_type", ""))
    merged: dict[str, Any] = dict(BASE_DEFAULTS)
    merged.update(FAMILY_DEFAULTS.get(model_type, {}))
    merged.update(config)
    return merged
