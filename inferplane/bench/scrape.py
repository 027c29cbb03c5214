"""The target's Prometheus `/metrics` before and after a run: server-side counters
(prefix-cache hit rate, preemptions, queue time) beside the client's numbers."""

from __future__ import annotations

from typing import Any

from inferplane.engines import engine_for, read_metrics
from inferplane.engines import metrics as m

# Counters worth a delta, in the engine boundary's neutral names; the JSON keeps the
# engine's own names (the first of each mapping) so its readers see what the engine exports.
_COUNTERS = (
    m.PREFIX_CACHE_QUERIES, m.PREFIX_CACHE_HITS, m.PREEMPTIONS, m.PROMPT_TOKENS,
    m.GENERATION_TOKENS, m.REQUESTS_FINISHED,
)
_NAMES = engine_for("vllm").metrics
_QUEUE = _NAMES[m.QUEUE_TIME][0]


def parse_samples(text: str) -> dict[str, float]:
    """The counters and the queue-time histogram's sum/count of one scrape, by the engine's
    metric name (summed over label sets); absent ones are left out."""
    reading = read_metrics(text, _NAMES, (*_COUNTERS, m.QUEUE_TIME, m.KV_CACHE_USAGE))
    out: dict[str, float] = {}
    for key in _COUNTERS:
        value = reading.total(key)
        if value is not None:
            out[_NAMES[key][0]] = value
    _, total, count = reading.histogram(m.QUEUE_TIME)
    if count:
        out[_QUEUE + "_sum"], out[_QUEUE + "_count"] = total, count
    kv = reading.total(m.KV_CACHE_USAGE)
    if kv is not None:
        out[_NAMES[m.KV_CACHE_USAGE][0]] = kv
    return out


async def fetch(url: str, timeout_s: float = 5.0) -> str | None:
    """The text of `url`/metrics, or None when it cannot be read (never raises)."""
    import aiohttp

    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(url.rstrip("/") + "/metrics") as response,
        ):
            if response.status != 200:
                return None
            return await response.text()
    except (aiohttp.ClientError, TimeoutError, OSError):
        return None


def server_delta(before: str | None, after: str | None) -> dict[str, Any]:
    """Counter deltas and the derived prefix-cache hit rate and mean queue time."""
    if before is None or after is None:
        return {"scraped": False}
    try:
        b, a = parse_samples(before), parse_samples(after)
    except ValueError:
        return {"scraped": False}
    kv_name = _NAMES[m.KV_CACHE_USAGE][0]
    delta = {name: a.get(name, 0.0) - b.get(name, 0.0) for name in a if name != kv_name}
    out = _derive(delta)
    if kv_name in a:
        out["kv_cache_usage_after"] = a[kv_name]
    return out


def _derive(delta: dict[str, float]) -> dict[str, Any]:
    out: dict[str, Any] = {"scraped": True, "deltas": delta}
    queries = delta.get(_NAMES[m.PREFIX_CACHE_QUERIES][0], 0.0)
    if queries > 0:
        out["prefix_cache_hit_rate"] = delta.get(_NAMES[m.PREFIX_CACHE_HITS][0], 0.0) / queries
    preemptions = _NAMES[m.PREEMPTIONS][0]
    if preemptions in delta:
        out["preemptions"] = delta[preemptions]
    count = delta.get(_QUEUE + "_count", 0.0)
    if count > 0:
        out["mean_queue_time_ms"] = 1000.0 * delta.get(_QUEUE + "_sum", 0.0) / count
    return out


def merge_deltas(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Several engines' deltas as one (a fleet target scrapes every engine)."""
    scraped = [p for p in parts if p.get("scraped")]
    if not scraped:
        return {"scraped": False}
    total: dict[str, float] = {}
    for part in scraped:
        for name, value in part["deltas"].items():
            total[name] = total.get(name, 0.0) + value
    merged = _derive(total)
    merged["engines"] = len(scraped)
    return merged
