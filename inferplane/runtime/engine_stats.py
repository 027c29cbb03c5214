"""Live figures of each engine for `inferplane status`: queue and KV cache from /metrics.

Read through the engine boundary's one reader (`engines.metrics`, neutral names; the
engine maps them to its own, older aliases as fallbacks): requests waiting and running
(summed over data-parallel ranks), KV cache usage (the highest).
A figure the engine does not report, or an engine that does not answer, is None.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

import httpx

from inferplane.engines import MetricNames, engine_for, read_metrics
from inferplane.engines import metrics as m

_KEYS = (m.REQUESTS_WAITING, m.REQUESTS_RUNNING, m.KV_CACHE_USAGE)


@dataclass(frozen=True)
class EngineStats:
    waiting: float | None = None
    running: float | None = None
    kv_cache_usage: float | None = None  # 0..1


def parse_engine_stats(text: str, names: MetricNames | None = None) -> EngineStats:
    reading = read_metrics(text, engine_for("vllm").metrics if names is None else names, _KEYS)
    return EngineStats(
        waiting=reading.total(m.REQUESTS_WAITING),
        running=reading.total(m.REQUESTS_RUNNING),
        kv_cache_usage=reading.highest(m.KV_CACHE_USAGE),
    )


async def read_engine_stats(urls: Iterable[str], timeout_s: float = 1.0) -> dict[str, EngineStats]:
    """GET URL/metrics of every engine at once; an engine that fails reads as unknown."""
    unique = list(dict.fromkeys(urls))
    async with httpx.AsyncClient(timeout=timeout_s, trust_env=False) as client:

        async def one(url: str) -> EngineStats:
            try:
                resp = await client.get(url + engine_for("vllm").endpoints.metrics)
            except httpx.HTTPError:
                return EngineStats()
            return parse_engine_stats(resp.text) if resp.status_code == 200 else EngineStats()

        results = await asyncio.gather(*(one(u) for u in unique))
    return dict(zip(unique, results, strict=True))
