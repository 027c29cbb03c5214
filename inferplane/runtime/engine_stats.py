"""Live figures of each engine for `inferplane status`: queue and KV cache from /metrics.

Read with vLLM's current metric names (the older KV alias as a fallback): requests
waiting and running (summed over data-parallel ranks), KV cache usage (the highest).
A figure the engine does not report, or an engine that does not answer, is None.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

import httpx

WAITING = ("vllm:num_requests_waiting",)
RUNNING = ("vllm:num_requests_running",)
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # v1, then v0 name


@dataclass(frozen=True)
class EngineStats:
    waiting: float | None = None
    running: float | None = None
    kv_cache_usage: float | None = None  # 0..1


def _values(text: str) -> dict[str, list[float]]:
    wanted = {*WAITING, *RUNNING, *KV_USAGE}
    found: dict[str, list[float]] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        brace = line.find("{")
        if brace >= 0:
            name, rest = line[:brace], line[line.rfind("}") + 1 :]
        else:
            name, _, rest = line.partition(" ")
        if name not in wanted:
            continue
        parts = rest.split()
        try:
            found.setdefault(name, []).append(float(parts[0]))
        except (IndexError, ValueError):
            continue
    return found


def parse_engine_stats(text: str) -> EngineStats:
    found = _values(text)

    def first(names: tuple[str, ...]) -> list[float]:
        for name in names:
            if name in found:
                return found[name]
        return []

    waiting, running, kv = first(WAITING), first(RUNNING), first(KV_USAGE)
    return EngineStats(
        waiting=sum(waiting) if waiting else None,
        running=sum(running) if running else None,
        kv_cache_usage=max(kv) if kv else None,
    )


async def read_engine_stats(urls: Iterable[str], timeout_s: float = 1.0) -> dict[str, EngineStats]:
    """GET URL/metrics of every engine at once; an engine that fails reads as unknown."""
    unique = list(dict.fromkeys(urls))
    async with httpx.AsyncClient(timeout=timeout_s, trust_env=False) as client:

        async def one(url: str) -> EngineStats:
            try:
                resp = await client.get(url + "/metrics")
            except httpx.HTTPError:
                return EngineStats()
            return parse_engine_stats(resp.text) if resp.status_code == 200 else EngineStats()

        results = await asyncio.gather(*(one(u) for u in unique))
    return dict(zip(unique, results, strict=True))
