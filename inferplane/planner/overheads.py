"""Memory vLLM needs besides weights and KV cache: profile-run activations, non-torch
buffers, CUDA graphs and the per-process CUDA context.

These are models of measured behaviour, not exact accounting: the constants below were fitted
to published vLLM startup logs (tests/data/vllm_logs/, see docs/estimator.md for the error
per case). Everything is per GPU (per TP rank).
"""

from __future__ import annotations

from inferplane.models.profile import ModelProfile
from inferplane.planner.vllm_versions import parse_version

GIB = 1024**3
MIB = 1024**2

# Sampler warm-up: fp32 logits over the whole vocabulary for every dummy request, plus the
# copies top-k/top-p sampling makes (probabilities, sort values/indices, noise).
SAMPLER_BYTES_PER_LOGIT = 12
# Live copies of the hidden state during a forward pass (residual, normed input, output).
RESIDUAL_COPIES = 3
# cuBLAS workspaces, attention-backend buffers: present in every process.
NON_TORCH_BASE_BYTES = int(0.12 * GIB)
# V0 measured non-torch memory from a baseline taken before the model was created, so it
# also counts allocator and library state the v1 baseline excludes (0.35 GiB in V0 logs).
NON_TORCH_V0_BYTES = int(0.35 * GIB)
# NCCL communicators and custom all-reduce buffers, only with tensor parallelism.
NON_TORCH_TP_BYTES = int(0.40 * GIB)
# CUDA graph pool: per captured batch size and per layer (piecewise graphs), fitted to logs.
CUDA_GRAPH_BYTES_PER_SIZE_LAYER = int(0.25 * MIB)
CUDA_GRAPH_BASE_BYTES = int(0.05 * GIB)
# CUDA context + kernels of one process: outside --gpu-memory-utilization (P01).
CUDA_CONTEXT_BYTES = int(0.5 * GIB)


def activation_peak_bytes(
    profile: ModelProfile,
    tp: int,
    dtype_bytes: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    generate: bool,
    era: str = "v1new",
) -> int:
    """Peak torch allocation of vLLM's profile run: one forward of `max_num_batched_tokens`
    tokens, then a sampler (or pooler) run over min(max_num_seqs, tokens) requests."""
    tokens = max_num_batched_tokens
    h = profile.hidden_size
    q_width = profile.num_attention_heads * profile.head_dim // tp
    kv_width = 2 * max(1, profile.num_kv_heads // tp) * profile.head_dim
    attention = tokens * (2 * q_width + kv_width) * dtype_bytes
    if profile.is_moe:
        inter = profile.moe_intermediate_size // tp
        topk = profile.num_experts_per_tok
        # fused_moe: gate_up cache, activation cache, per-expert output cache, router logits
        mlp = tokens * topk * (3 * inter + h) * dtype_bytes + tokens * profile.num_experts * 4
    else:
        mlp = tokens * 3 * (profile.intermediate_size // tp) * dtype_bytes
    residual = tokens * h * dtype_bytes * RESIDUAL_COPIES
    forward = max(attention, mlp) + residual
    if not generate:
        return forward
    requests = min(max_num_seqs, max_num_batched_tokens)
    sampler = requests * profile.vocab_size * SAMPLER_BYTES_PER_LOGIT
    if era == "v0":
        # V0 frees the forward's activations before sampling: the peak is one or the other.
        return max(forward, sampler)
    # V1 logs show the sampler warm-up on top of the forward peak (kept intermediate buffers).
    return forward + sampler


def non_torch_bytes(tp: int, era: str = "v1new", pp: int = 1) -> int:
    """Per GPU. Pipeline stages talk over NCCL too (send/recv between stages); the TP figure
    is used for them as well, an assumption no published multi-node log has checked yet."""
    base = NON_TORCH_V0_BYTES if era == "v0" else NON_TORCH_BASE_BYTES
    return base + (NON_TORCH_TP_BYTES if tp > 1 or pp > 1 else 0)


def cuda_graph_capture_sizes(max_num_seqs: int, vllm_version: str) -> list[int]:
    """vLLM's default `cudagraph_capture_sizes` for this batch limit and release."""
    _, minor, _ = parse_version(vllm_version)
    largest = min(2 * max_num_seqs, 512)
    if minor >= 11:
        candidates = [1, 2, 4, *range(8, 256, 8), *range(256, largest + 1, 16)]
    else:
        candidates = [1, 2, 4, *range(8, 513, 8)]
    return [size for size in candidates if size <= largest]


def cuda_graph_bytes(profile: ModelProfile, max_num_seqs: int, vllm_version: str) -> int:
    sizes = len(cuda_graph_capture_sizes(max_num_seqs, vllm_version))
    return CUDA_GRAPH_BASE_BYTES + sizes * profile.num_layers * CUDA_GRAPH_BYTES_PER_SIZE_LAYER
