"""Reading a vLLM replica's Prometheus text into an `EngineLoad`.

vLLM renamed metrics across versions; we read the current name first and the older alias
as a fallback. A reading that lacks the queue gauges is *unusable*, and the caller treats
the replica as saturated, never as idle (the production-stack router reads removed names
as 0 and piles traffic onto busy replicas).
"""

from __future__ import annotations

from inferplane.gateway.backend import EngineLoad

WAITING = ("vllm:num_requests_waiting",)
RUNNING = ("vllm:num_requests_running",)
# kv_cache_usage_perc is the v1 name; gpu_cache_usage_perc the v0 one.
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
SLEEP_STATE = "vllm:engine_sleep_state"

_WANTED = frozenset((*WAITING, *RUNNING, *KV_USAGE, SLEEP_STATE))


def _samples(text: str) -> dict[str, list[tuple[str, float]]]:
    """name -> [(label text, value)] for the metrics we care about."""
    found: dict[str, list[tuple[str, float]]] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        brace = line.find("{")
        if brace >= 0:
            name = line[:brace]
            close = line.rfind("}")
            if close < brace:
                continue
            labels, rest = line[brace + 1 : close], line[close + 1 :]
        else:
            name, _, rest = line.partition(" ")
            labels = ""
        if name not in _WANTED:
            continue
        parts = rest.split()
        if not parts:
            continue
        try:
            value = float(parts[0])
        except ValueError:
            continue
        found.setdefault(name, []).append((labels, value))
    return found


def _first(found: dict[str, list[tuple[str, float]]], names: tuple[str, ...]) -> list[float]:
    for name in names:
        if name in found:
            return [v for _, v in found[name]]
    return []


def parse_engine_load(text: str, now: float) -> EngineLoad | None:
    """Sum queue gauges over engines (data parallel ranks), take the highest KV usage.

    Returns None when the text lacks the waiting or running gauge; a missing KV gauge
    reads as full.
    """
    found = _samples(text)
    waiting = _first(found, WAITING)
    running = _first(found, RUNNING)
    if not waiting or not running:
        return None
    kv = _first(found, KV_USAGE)
    awake = True
    for labels, value in found.get(SLEEP_STATE, ()):
        if 'sleep_state="awake"' in labels and value == 0:
            awake = False
    return EngineLoad(
        waiting=sum(waiting),
        running=sum(running),
        kv_usage=max(kv) if kv else 1.0,  # unknown KV usage counts as full
        awake=awake,
        read_at=now,
    )
