"""`ModelProfile`: everything the planner needs to know about one model checkpoint.

Built by `inferplane.models.load_profile` from a model directory (config.json, safetensors
headers) or from a config alone. Pure data; no GPU knowledge here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# Attention kind of one decoder layer, as vLLM's KV-cache specs see it.
#   full    -> FullAttentionSpec (MHA/GQA over the whole context)
#   sliding -> SlidingWindowSpec (only the last `sliding_window` tokens are kept)
#   mla     -> MLAAttentionSpec (one compressed latent per token, DeepSeek V2/V3)
#   none    -> the layer keeps no KV cache (e.g. encoder-only / linear layers)
LayerAttention = Literal["full", "sliding", "mla", "none"]

Task = Literal["generate", "embed"]


@dataclass(frozen=True)
class QuantizationInfo:
    """Checkpoint quantization, from `quantization_config` or `hf_quant_config.json`."""

    method: str  # vLLM's name: "fp8", "awq", "gptq", "mxfp4", "compressed-tensors", "modelopt", ...
    weight_bits: int  # bits per quantized weight element (8 for fp8, 4 for awq/gptq/mxfp4)
    group_size: int | None = None  # elements sharing one scale (awq/gptq 128, mxfp4 32)
    kv_cache_dtype: str | None = None  # a KV dtype the checkpoint asks for (modelopt "fp8")
    excluded_modules: tuple[str, ...] = ()  # modules kept in the original dtype


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts by role; the estimator sizes each role with its own dtype rule.

    `linear` holds the quantizable projection weights of attention and dense MLPs;
    `experts` holds routed-expert weights of MoE layers (all experts are loaded, P04);
    `embedding` / `lm_head` stay in the model dtype under weight-only quantization;
    `other` is norms, biases, router gates and anything else small.
    """

    embedding: int
    lm_head: int  # 0 when tied to the embedding
    linear: int
    experts: int
    other: int

    @property
    def total(self) -> int:
        return self.embedding + self.lm_head + self.linear + self.experts + self.other


@dataclass(frozen=True)
class ModelProfile:
    """Architecture facts of one checkpoint, normalised across model families."""

    name: str  # directory name or model id
    architecture: str  # e.g. "LlamaForCausalLM"
    model_type: str  # e.g. "llama", "qwen3_moe", "deepseek_v3"
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int  # per-head dim of Q/K (for MLA: qk_nope_head_dim + qk_rope_head_dim)
    vocab_size: int
    intermediate_size: int  # dense MLP width (0 if every layer is MoE)
    max_position_embeddings: int  # the context vLLM derives by default (incl. rope scaling)
    torch_dtype: str  # "bfloat16", "float16" or "float32"
    tie_word_embeddings: bool
    layer_attention: tuple[LayerAttention, ...]  # one entry per decoder layer
    params: ParamCounts
    v_head_dim: int | None = None  # when V's head dim differs from K's
    sliding_window: int | None = None
    # MLA (DeepSeek-V2/V3 family); None for other models.
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    # MoE; num_experts == 0 for dense models.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    num_moe_layers: int = 0
    quantization: QuantizationInfo | None = None
    default_task: Task = "generate"
    # Exact bytes of all tensors in the checkpoint's safetensors files, when present.
    weight_bytes_on_disk: int | None = None
    # The part of those bytes vLLM loads: without layers it skips (DeepSeek's MTP layer).
    weight_bytes_loaded: int | None = None
    params_source: Literal["safetensors", "config"] = "config"
    warnings: tuple[str, ...] = field(default_factory=tuple)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def uses_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def active_params(self) -> int:
        """Parameters touched per token (for FLOPs), not what must be in memory (P04)."""
        if not self.is_moe or self.num_experts == 0:
            return self.params.total
        routed_active = self.params.experts * self.num_experts_per_tok // self.num_experts
        return self.params.total - self.params.experts + routed_active
