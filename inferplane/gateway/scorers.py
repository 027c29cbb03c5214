"""Routing as a chain of small scorers (after llm-d's inference scheduler).

Each scorer rates every candidate replica in [0, 1]; the pool picks the highest weighted
sum. Candidates are already filtered to replicas that are ready, not ejected, awake and
below their concurrency cap, so scorers only express preference.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from inferplane.gateway.backend import Backend


@dataclass(slots=True)
class RouteContext:
    """What scorers may read about the request being routed."""

    prefix_key: bytes | None = None  # leading prompt bytes, when prefix affinity is on
    session: bytes | None = None  # value of the session header
    now: float = 0.0  # loop time, for staleness checks
    holders: frozenset[str] | None = None  # a LoRA adapter's request: URLs holding it
    warm: frozenset[str] | None = None  # ... and those that served it lately (gateway/lora.py)


class Scorer(Protocol):
    weight: float

    def score(self, candidates: Sequence[Backend], ctx: RouteContext) -> list[float]: ...


class LeastOutstanding:
    """Prefer the replica with the smallest share of its cap in flight."""

    def __init__(self, default_cap: int, weight: float = 1.0) -> None:
        self.default_cap = default_cap
        self.weight = weight

    def score(self, candidates: Sequence[Backend], ctx: RouteContext) -> list[float]:
        cap = self.default_cap
        return [1.0 - b.outstanding / (b.max_concurrency or cap) for b in candidates]


class EngineMetricsScorer:
    """Prefer replicas whose engine reports short queues and free KV cache.

    A replica with no reading, or one older than `stale_after_s`, scores 0 (saturated) and
    is counted by `on_unusable` so operators can see the scorer flying blind.
    """

    def __init__(
        self,
        stale_after_s: float,
        on_unusable: OnUnusable | None = None,
        weight: float = 2.0,
    ) -> None:
        self.stale_after_s = stale_after_s
        self.on_unusable = on_unusable
        self.weight = weight

    def score(self, candidates: Sequence[Backend], ctx: RouteContext) -> list[float]:
        scores: list[float] = []
        for b in candidates:
            load = b.engine
            if load is None or ctx.now - load.read_at > self.stale_after_s:
                if self.on_unusable is not None:
                    self.on_unusable(b, "missing" if load is None else "stale")
                scores.append(0.0)
                continue
            scores.append((1.0 - min(1.0, load.kv_usage)) / (1.0 + load.waiting))
        return scores


class OnUnusable(Protocol):
    def __call__(self, backend: Backend, reason: str) -> None: ...


def _hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


class HashRing:
    """Consistent hashing over replica URLs: every gateway replica builds the same ring
    from the same URLs, so they agree on placement without shared state."""

    VNODES = 64

    def __init__(self, urls: Sequence[str]) -> None:
        points: list[tuple[int, str]] = []
        for url in urls:
            for i in range(self.VNODES):
                points.append((_hash64(f"{url}#{i}".encode()), url))
        points.sort()
        self._keys = [p[0] for p in points]
        self._urls = [p[1] for p in points]

    def walk(self, key: bytes) -> list[str]:
        """Distinct URLs in ring order starting at the key's position."""
        if not self._keys:
            return []
        start = bisect_left(self._keys, _hash64(key)) % len(self._keys)
        order: list[str] = []
        seen: set[str] = set()
        n = len(self._keys)
        for i in range(n):
            url = self._urls[(start + i) % n]
            if url not in seen:
                seen.add(url)
                order.append(url)
        return order


class _RingScorer:
    def __init__(self, weight: float) -> None:
        self.weight = weight
        self._ring = HashRing(())
        self._ring_urls: tuple[str, ...] = ()

    def set_pool(self, urls: Sequence[str]) -> None:
        # The ring covers the whole pool (not just today's candidates) so placement is
        # stable while replicas move in and out of the candidate set.
        key = tuple(sorted(urls))
        if key != self._ring_urls:
            self._ring_urls = key
            self._ring = HashRing(key)

    def _pick(self, candidates: Sequence[Backend], key: bytes, cap: float | None) -> list[float]:
        index = {b.url: i for i, b in enumerate(candidates)}
        scores = [0.0] * len(candidates)
        for url in self._ring.walk(key):
            i = index.get(url)
            if i is None:
                continue
            if cap is None or candidates[i].outstanding < cap:
                scores[i] = 1.0
                break
        return scores


class PrefixAffinity(_RingScorer):
    """Consistent hashing with bounded loads (Mirrokni et al.): a prompt prefix goes to its
    ring replica unless that replica already holds more than `load_factor` x the average
    in-flight load; then it spills to the next replica on the ring (P45)."""

    def __init__(self, load_factor: float, weight: float = 3.0) -> None:
        super().__init__(weight)
        self.load_factor = load_factor

    def score(self, candidates: Sequence[Backend], ctx: RouteContext) -> list[float]:
        if ctx.prefix_key is None:
            return [0.0] * len(candidates)
        total = sum(b.outstanding for b in candidates)
        # +1 counts the request being placed; the cap is at least 1 so an idle pool places.
        cap = max(1.0, self.load_factor * (total + 1) / len(candidates))
        return self._pick(candidates, ctx.prefix_key, cap)


class SessionAffinity(_RingScorer):
    """Keep one session (by header) on one replica while that replica is a candidate."""

    def __init__(self, weight: float = 4.0) -> None:
        super().__init__(weight)

    def score(self, candidates: Sequence[Backend], ctx: RouteContext) -> list[float]:
        if ctx.session is None:
            return [0.0] * len(candidates)
        return self._pick(candidates, ctx.session, None)


def pick_best(
    candidates: Sequence[Backend], scorers: Sequence[Scorer], ctx: RouteContext, turn: int
) -> Backend:
    """Highest weighted score; ties rotate by `turn` so equal replicas share the load."""
    n = len(candidates)
    if n == 1:
        return candidates[0]
    totals = [0.0] * n
    for scorer in scorers:
        w = scorer.weight
        for i, s in enumerate(scorer.score(candidates, ctx)):
            totals[i] += w * s
    best = max(totals)
    ties = [i for i, t in enumerate(totals) if t >= best - 1e-9]
    return candidates[ties[turn % len(ties)]]
