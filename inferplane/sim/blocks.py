"""Paged KV blocks with prefix caching, the way vLLM v1's BlockPool counts them.

Only full blocks are cached. A block's hash chains its parent's hash with its token ids,
so equal hashes mean equal prefixes. Freed blocks keep their hash until they are reused
(least recently freed first), which is what makes later prefix hits possible. Usage is
`1 - free / total`, vLLM's `kv_cache_usage_perc`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of every full block of `token_ids`."""
    hashes: list[int] = []
    parent = 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        hashes.append(parent)
    return hashes


class BlockPool:
    """Fixed pool of KV blocks; reference counted, with a hash index of cached blocks."""

    def __init__(self, num_blocks: int, *, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self._refs = [0] * num_blocks
        self._hash_of: dict[int, int] = {}  # block id -> hash
        self._block_of: dict[int, int] = {}  # hash -> block id
        # Free blocks in eviction order; cached-but-free blocks sit here too.
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self._free) / self.num_blocks

    def cached_prefix(self, hashes: Sequence[int]) -> list[int]:
        """Block ids of the longest cached prefix of `hashes` (not yet referenced)."""
        if not self.enable_caching:
            return []
        found: list[int] = []
        for h in hashes:
            block = self._block_of.get(h)
            if block is None:
                break
            found.append(block)
        return found

    def take(self, blocks: Sequence[int]) -> None:
        """Reference cached blocks found by `cached_prefix`."""
        for block in blocks:
            if self._refs[block] == 0:
                del self._free[block]
            self._refs[block] += 1

    def allocate(self, count: int) -> list[int] | None:
        """`count` fresh blocks, evicting the least recently freed; None if too few."""
        if count > len(self._free):
            return None
        blocks: list[int] = []
        for _ in range(count):
            block, _ = self._free.popitem(last=False)
            old = self._hash_of.pop(block, None)
            if old is not None:
                del self._block_of[old]
            self._refs[block] = 1
            blocks.append(block)
        return blocks

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference from each block; tail blocks are freed first (evicted last)."""
        for block in reversed(blocks):
            self._refs[block] -= 1
            if self._refs[block] == 0:
                self._free[block] = None

    def cache(self, block: int, block_hash: int) -> None:
        """Record that `block` holds the full block with `block_hash`."""
        if not self.enable_caching or block_hash in self._block_of or block in self._hash_of:
            return
        self._hash_of[block] = block_hash
        self._block_of[block_hash] = block

    def reset_cache(self) -> None:
        """Forget every cached hash (the KV cache was discarded: vLLM sleep mode)."""
        self._hash_of.clear()
        self._block_of.clear()
