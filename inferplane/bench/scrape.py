"""The target's Prometheus `/metrics` before and after a run: server-side counters
(prefix-cache hit rate, preemptions, queue time) beside the client's numbers."""

from __future__ import annotations

from typing import Any

# vLLM counter/histogram samples worth a delta (summed over label sets).
_DELTAS = (
    "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions",
    "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success",
    "vllm:request_queue_time_seconds_sum", "vllm:request_queue_time_seconds_count",
)


def parse_samples(text: str) -> dict[str, float]:
    """Sum every sample of the exposition by name (labels dropped); `_total` suffixes kept
    under the bare name too, so both naming styles match."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            out[name] = out.get(name, 0.0) + float(sample.value)
            if name.endswith("_total"):
                bare = name[: -len("_total")]
                out[bare] = out.get(bare, 0.0) + float(sample.value)
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
    delta = {name: a.get(name, 0.0) - b.get(name, 0.0) for name in _DELTAS if name in a}
    out = _derive(delta)
    if "vllm:kv_cache_usage_perc" in a:
        out["kv_cache_usage_after"] = a["vllm:kv_cache_usage_perc"]
    return out


def _derive(delta: dict[str, float]) -> dict[str, Any]:
    out: dict[str, Any] = {"scraped": True, "deltas": delta}
    queries = delta.get("vllm:prefix_cache_queries", 0.0)
    if queries > 0:
        out["prefix_cache_hit_rate"] = delta.get("vllm:prefix_cache_hits", 0.0) / queries
    if "vllm:num_preemptions" in delta:
        out["preemptions"] = delta["vllm:num_preemptions"]
    count = delta.get("vllm:request_queue_time_seconds_count", 0.0)
    if count > 0:
        out["mean_queue_time_ms"] = (
            1000.0 * delta.get("vllm:request_queue_time_seconds_sum", 0.0) / count
        )
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
