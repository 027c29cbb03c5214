"""Weights one step of an MoE model actually reads.

A dense layer reads all its weights once per step whatever the batch. A routed-expert
layer reads only the experts its tokens were sent to: with top-k routing over E experts
and tokens routed independently and uniformly, an expert is untouched by one token with
probability 1 - k/E, so B tokens touch E * (1 - (1 - k/E)^B) distinct experts on average.
Decode at batch 1 reads k experts per layer; a large batch reads all E. Shared experts,
attention, norms, embeddings and the LM head are read every step like dense weights.
"""

from __future__ import annotations


def expected_distinct_experts(num_experts: int, top_k: int, tokens: int) -> float:
    """Expected number of distinct experts B=`tokens` tokens touch with top-k routing."""
    if num_experts <= 0 or tokens <= 0:
        return 0.0
    k = min(top_k, num_experts)
    return num_experts * (1.0 - (1.0 - k / num_experts) ** tokens)


def weight_bytes_read(dense_bytes: float, expert_bytes: float, num_experts: int,
                      top_k: int, tokens: int) -> tuple[float, float]:
    """(dense, routed-expert) bytes one step over `tokens` tokens reads on one GPU.
    `expert_bytes` is all routed experts of all layers on that GPU (every one is loaded)."""
    if num_experts <= 0 or expert_bytes <= 0:
        return dense_bytes, 0.0
    touched = expected_distinct_experts(num_experts, top_k, tokens) / num_experts
    return dense_bytes, expert_bytes * touched
