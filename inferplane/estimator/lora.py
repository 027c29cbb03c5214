"""What vLLM reserves on each GPU for LoRA adapters (`--enable-lora`).

vLLM wraps every linear layer of the model (and, for the architectures that list
`embedding_modules`, the input embedding and the LM head) in a LoRA layer whose
`create_lora_weights` allocates, for `max_loras` slots at `max_lora_rank`, one stacked
A and one stacked B matrix per output slice (vllm/lora/layers/*.py, v0.32):

    A: [max_loras, 1, max_lora_rank, input_size_per_gpu]          per slice
    B: [max_loras, 1, output_slice_per_gpu, max_lora_rank]        per slice

in the LoRA dtype (the model's dtype). The sizes per GPU follow the base layer's tensor
parallel split: column-parallel layers (qkv, gate/up) split their output, row-parallel
ones (o_proj, down_proj) their input; K/V heads are replicated when TP exceeds their
number. MoE layers (FusedMoEWithLoRA) stack every local expert. The reservation is made
while the model loads (inside vLLM's "Model loading took" figure), so the KV cache shrinks
by exactly this much. The profile run adds only the LoRA kernels' fp32 shrink buffer
(slices x tokens x rank), which this module also returns.

The rule holds for vLLM >= 0.12 (LoRA extra vocabulary removed, PRs 28382/28545); older
releases add 256 embedding rows per slot, under 1 % of the reservation for usual ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferplane.errors import InferplaneError
from inferplane.models.profile import ModelProfile

# Architectures whose vLLM class lists `embedding_modules` (embed_tokens + lm_head), so their
# input embedding and LM head get LoRA slots too (vllm/model_executor/models/*.py, v0.32).
EMBEDDING_LORA_ARCHITECTURES = frozenset({
    "LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM",
    "GraniteForCausalLM", "GraniteMoeForCausalLM", "ExaoneForCausalLM", "Exaone4ForCausalLM",
    "NemotronForCausalLM", "PhiMoEForCausalLM", "MiniCPMForCausalLM", "SolarForCausalLM",
})
SHRINK_BUFFER_BYTES = 4  # the punica shrink kernels accumulate in fp32


@dataclass(frozen=True)
class LoraSlots:
    """The engine's LoRA capacity: GPU slots and the rank every slot is sized for."""

    max_loras: int
    max_lora_rank: int


@dataclass(frozen=True)
class WrappedModule:
    """One module vLLM wraps, per GPU: input size per slice and each slice's output size."""

    name: str  # the module's name in vLLM (qkv_proj, o_proj, gate_up_proj, ...)
    inputs: tuple[int, ...]  # A's input size, one per slice
    outputs: tuple[int, ...]  # B's output size, one per slice
    count: int  # how many of them the GPU holds (layers x experts)

    def elements_per_rank(self) -> int:
        """A + B elements of one slot at rank 1."""
        return self.count * (sum(self.inputs) + sum(self.outputs))


def supports_lora_estimate(profile: ModelProfile) -> str | None:
    """None when the reservation can be computed for `profile`, else why not."""
    if profile.uses_mla:
        return "multi-head latent attention (DeepSeek-style) LoRA layers are not modelled"
    if profile.is_moe and profile.num_shared_experts:
        return "MoE models with shared experts are not modelled"
    if profile.default_task != "generate":
        return "vLLM serves LoRA adapters for generation models only"
    return None


def wrapped_modules(
    profile: ModelProfile, tp: int, *, num_layers: int | None = None,
    first_stage: bool = True, last_stage: bool = True,
) -> list[WrappedModule]:
    """The modules vLLM wraps on one GPU of tensor-parallel size `tp`."""
    problem = supports_lora_estimate(profile)
    if problem is not None:
        raise InferplaneError(
            f"cannot size the LoRA reservation of {profile.architecture}: {problem}",
            field="lora", value=profile.architecture,
            fix="serve adapters on a dense or MoE model without shared experts, or merge the "
                "adapter into the weights and serve it as its own model",
        )
    layers = profile.num_layers if num_layers is None else num_layers
    moe_layers = min(layers, profile.num_moe_layers) if profile.is_moe else 0
    dense_layers = layers - moe_layers
    hidden = profile.hidden_size
    q_out = profile.num_attention_heads * profile.head_dim // tp
    kv_heads = max(1, profile.num_kv_heads // tp)
    kv_out = kv_heads * (profile.v_head_dim or profile.head_dim)
    k_out = kv_heads * profile.head_dim
    out: list[WrappedModule] = []
    if layers:
        out += [
            WrappedModule("qkv_proj", (hidden,) * 3, (q_out, k_out, kv_out), layers),
            WrappedModule("o_proj", (profile.num_attention_heads
                                     * (profile.v_head_dim or profile.head_dim) // tp,),
                          (hidden,), layers),
        ]
    if dense_layers and profile.intermediate_size:
        inter = profile.intermediate_size // tp
        out += [
            WrappedModule("gate_up_proj", (hidden,) * 2, (inter, inter), dense_layers),
            WrappedModule("down_proj", (inter,), (hidden,), dense_layers),
        ]
    if moe_layers:
        experts = profile.num_experts
        inter = profile.moe_intermediate_size // tp
        out += [
            WrappedModule("gate", (hidden,), (experts,), moe_layers),  # the router
            WrappedModule("experts.w13", (hidden,) * 2, (inter, inter), moe_layers * experts),
            WrappedModule("experts.w2", (inter,), (hidden,), moe_layers * experts),
        ]
    if profile.architecture in EMBEDDING_LORA_ARCHITECTURES:
        vocab = profile.vocab_size
        has_embedding = first_stage or (profile.tie_word_embeddings and last_stage)
        if has_embedding:
            out.append(WrappedModule("embed_tokens", (vocab,), (hidden,), 1))
        if last_stage:
            out.append(WrappedModule("lm_head", (hidden,), (vocab,), 1))
    return out


def reservation_bytes(modules: list[WrappedModule], slots: LoraSlots, dtype_bytes: int) -> int:
    """Bytes of the stacked A/B slot tensors of `modules` on one GPU."""
    per_rank = sum(m.elements_per_rank() for m in modules)
    return per_rank * slots.max_loras * slots.max_lora_rank * dtype_bytes


def shrink_buffer_bytes(modules: list[WrappedModule], slots: LoraSlots, tokens: int) -> int:
    """The profile run's largest LoRA intermediate: fp32 [slices, tokens, rank]."""
    widest = max((len(m.outputs) for m in modules if m.name != "embed_tokens"), default=0)
    return widest * tokens * slots.max_lora_rank * SHRINK_BUFFER_BYTES
