"""KV-cache geometry, blocks and concurrency, following vLLM v1's `kv_cache_utils.py`.

One *page* is one block of `block_size` tokens of one layer. Layers of one attention kind form
groups of `group_size` layers that share one pool of pages (hybrid models: full + sliding
window). `num_blocks = available // (page_bytes x group_size)`; one request at `max_model_len`
needs `sum over groups of that group's blocks` blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferplane.errors import InferplaneError
from inferplane.models.profile import LayerAttention, ModelProfile

KV_DTYPE_BYTES = {
    "auto": None,  # the model dtype
    "bfloat16": 2,
    "float16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
}

DEFAULT_BLOCK_SIZE = 16
MLA_BLOCK_SIZE_HOPPER = 64  # FlashMLA's block size on sm90+


@dataclass(frozen=True)
class KvGroup:
    kind: LayerAttention  # "full", "sliding" or "mla"
    layers: int  # real layers in this group (<= group_size; the rest is padding)


@dataclass(frozen=True)
class KvLayout:
    block_size: int
    page_bytes: int  # one block of one layer on one GPU
    group_size: int  # layers sharing one block id (tensors in the pool)
    groups: tuple[KvGroup, ...]
    sliding_window: int | None
    bytes_per_token_per_gpu: int  # all KV layers of one rank, for one token
    bytes_per_token_total: int  # all layers, before the TP split

    def blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """Blocks one request at `max_model_len` can occupy (vLLM's max_memory_usage_bytes)."""
        blocks = 0
        for group in self.groups:
            if group.kind == "sliding" and self.sliding_window:
                window = min(self.sliding_window - 1 + max_num_batched_tokens, max_model_len)
                blocks += math.ceil(window / self.block_size) + 1
            else:
                blocks += math.ceil(max_model_len / self.block_size)
        return blocks

    def bytes_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        blocks = self.blocks_per_request(max_model_len, max_num_batched_tokens)
        return blocks * self.page_bytes * self.group_size

    def num_blocks(self, available_bytes: int) -> int:
        return max(0, available_bytes // (self.page_bytes * self.group_size))


def kv_dtype_bytes(kv_cache_dtype: str, model_dtype_bytes: int) -> int:
    if kv_cache_dtype not in KV_DTYPE_BYTES:
        raise InferplaneError(
            "unknown KV cache dtype",
            field="kv_cache_dtype",
            value=kv_cache_dtype,
            fix="use auto, fp8, fp8_e4m3 or fp8_e5m2",
        )
    return KV_DTYPE_BYTES[kv_cache_dtype] or model_dtype_bytes


def layer_bytes_per_token(
    profile: ModelProfile, kind: LayerAttention, tp: int, dtype_bytes: int
) -> int:
    """KV bytes one token occupies in one layer on one rank."""
    if kind == "none":
        return 0
    if kind == "mla":
        # One compressed latent (+ rope key) per token, not split across ranks, no K/V pair.
        latent = (profile.kv_lora_rank or 0) + (profile.qk_rope_head_dim or 0)
        return latent * dtype_bytes
    heads = max(1, profile.num_kv_heads // tp)  # replicated when tp > kv heads
    v_dim = profile.v_head_dim or profile.head_dim
    return heads * (profile.head_dim + v_dim) * dtype_bytes


def _group_size(full_layers: int, sliding_layers: int) -> int:
    """vLLM's rule: the smaller count, unless the larger is under 1.5x of it."""
    small, large = sorted((full_layers, sliding_layers))
    return large if large < 1.5 * small else small


def kv_layout(
    profile: ModelProfile, tp: int, dtype_bytes: int, block_size: int
) -> KvLayout:
    kinds = [k for k in profile.layer_attention if k != "none"]
    per_layer = {k: layer_bytes_per_token(profile, k, tp, dtype_bytes) for k in set(kinds)}
    per_layer_total = {k: layer_bytes_per_token(profile, k, 1, dtype_bytes) for k in set(kinds)}
    bytes_per_token_gpu = sum(per_layer[k] for k in kinds)
    bytes_per_token_total = sum(per_layer_total[k] for k in kinds)
    if not kinds:
        return KvLayout(block_size, 0, 1, (), None, 0, 0)

    sliding = sum(1 for k in kinds if k == "sliding")
    global_kind: LayerAttention = "mla" if "mla" in kinds else "full"
    full = len(kinds) - sliding
    page = max(per_layer.values()) * block_size
    window = profile.sliding_window
    if sliding == 0 or full == 0:
        only: LayerAttention = "sliding" if full == 0 else global_kind
        return KvLayout(
            block_size, page, len(kinds), (KvGroup(only, len(kinds)),), window,
            bytes_per_token_gpu, bytes_per_token_total,
        )
    size = _group_size(full, sliding)
    groups: list[KvGroup] = []
    for kind, count in ((global_kind, full), ("sliding", sliding)):
        for start in range(0, count, size):
            groups.append(KvGroup(kind, min(size, count - start)))
    return KvLayout(
        block_size, page, size, tuple(groups), window, bytes_per_token_gpu, bytes_per_token_total
    )


def max_model_len_that_fits(
    layout: KvLayout, available_bytes: int, upper: int, max_num_batched_tokens: int
) -> int:
    """Largest length <= upper whose one request fits (vLLM's estimate_max_model_len)."""
    if layout.bytes_per_request(1, max_num_batched_tokens) > available_bytes:
        return 0
    lo, hi = 1, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if layout.bytes_per_request(mid, max_num_batched_tokens) <= available_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo
