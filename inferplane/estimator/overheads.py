"""Memory vLLM needs besides weights and KV cache: profile-run activations, non-torch
buffers, CUDA graphs and the per-process CUDA context.

These are models of measured behaviour, not exact accounting: the constants below were fitted
to published vLLM startup logs (tests/data/vllm_logs/, see docs/estimator.md for the error
per case). Everything is per GPU (per TP rank).
"""

from __future__ import annotations

from inferplane.engines.vllm.versions import parse_version
from inferplane.models.profile import ModelProfile

GIB = 1024**3
MIB = 1024**2

# Sampler warm-up (`_dummy_sampler_run`): one row of logits per dummy request over the whole
# vocabulary, sampled with temperature, top-k (vocab - 1) and top-p, so the top-k/top-p
# implementation decides the peak. Bytes per logit, by the implementation each release uses
# by default on CUDA (see sampler_bytes_per_logit):
# - V0 (< 0.8): at most the bf16 logits. Measured on an RTX 3090 (vLLM issue 10517, Llama-3.1
#   8B, 256 dummy requests): with max_model_len 35000 V0 chunks prefill by itself, profiles
#   512 tokens, and logs peak_torch_memory=15.05GiB over 14.9888 GiB of weights, i.e. 0.06 GiB
#   for a 512-token forward plus 256 x 128,256 logits (2 B each); at 20000 / 29000 tokens
#   the forward (2.07 / 2.99 GiB logged) is the peak.
SAMPLER_BYTES_PER_LOGIT_V0 = 2
# - PyTorch-native top-k/top-p (`apply_top_k_top_p`, V1 up to 0.16; FlashInfer's sampler is
#   opt-in or absent from pip installs): bf16 logits 2 + fp32 copy 4 + sort values 4 + sort
#   indices 8 + the sort's int64 iota 8 + cub's alternate key/value buffers 12 = 38 B. Matches
#   the logged peaks: 1.40 GiB at 256 x 151,936 (v0.10.2, L40S) and 4.76-7.38 GiB at 1,024
#   requests on H100 (llm-d's published profile of five models).
SAMPLER_BYTES_PER_LOGIT_SORT = 38
# - Triton top-k/top-p kernels (vLLM PR 33538; `apply_top_k_top_p_triton` for batches of 8+
#   from 0.17.0 on, checked in the 0.16.0 and 0.17.0 wheels): no full-vocabulary sort;
#   fitted to the two v0.19 logs (Qwen3-8B and gpt-oss-20b on A100, 19 and 22 B).
SAMPLER_BYTES_PER_LOGIT_TRITON = 20
SAMPLER_SORT_FROM = (0, 8, 0)
SAMPLER_TRITON_FROM = (0, 17, 0)
# Kept for callers that want one figure: the current release's.
SAMPLER_BYTES_PER_LOGIT = SAMPLER_BYTES_PER_LOGIT_TRITON
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


def sampler_bytes_per_logit(vllm_version: str) -> int:
    """Peak bytes per (request x vocabulary entry) of the sampler warm-up in this release."""
    release = parse_version(vllm_version)
    if release < SAMPLER_SORT_FROM:
        return SAMPLER_BYTES_PER_LOGIT_V0
    if release < SAMPLER_TRITON_FROM:
        return SAMPLER_BYTES_PER_LOGIT_SORT
    return SAMPLER_BYTES_PER_LOGIT_TRITON


def sampler_warmup_bytes(
    profile: ModelProfile, max_num_batched_tokens: int, max_num_seqs: int, vllm_version: str
) -> int:
    """The sampler warm-up alone: min(max_num_seqs, tokens) requests x the whole vocabulary
    (with TP the logits are gathered, so every rank holds all of them)."""
    requests = min(max_num_seqs, max_num_batched_tokens)
    return requests * profile.vocab_size * sampler_bytes_per_logit(vllm_version)


def activation_peak_bytes(
    profile: ModelProfile,
    tp: int,
    dtype_bytes: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    generate: bool,
    era: str = "v1new",
    vllm_version: str | None = None,
) -> int:
    """Peak torch allocation of vLLM's profile run: one forward of `max_num_batched_tokens`
    tokens, then a sampler (or pooler) run over min(max_num_seqs, tokens) requests.

    The forward's intermediates are freed before the sampler runs; only its output (the hidden
    state of every token) stays alive, so the peak is the larger of the forward and the sampler
    plus that hidden state. At vLLM's H100/H200 default of 1,024 requests the sampler is the
    larger by far (1,024 x 151,936 logits x 38 B = 5.5 GiB for Qwen3 before 0.17)."""
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
    version = vllm_version or _ERA_VERSION.get(era, "0.21.0")
    sampler = sampler_warmup_bytes(profile, max_num_batched_tokens, max_num_seqs, version)
    if era == "v0":
        # V0 frees the forward's activations before sampling: the peak is one or the other.
        return max(forward, sampler)
    hidden_kept = tokens * h * dtype_bytes
    return max(forward, hidden_kept + sampler)


# A release of each era, for callers that pass only the era.
_ERA_VERSION = {"v0": "0.6.4", "v1": "0.8.5", "v1mid": "0.10.2", "v1new": "0.21.0"}


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
