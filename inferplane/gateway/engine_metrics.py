"""Reading a replica's Prometheus text into an `EngineLoad` (through the engine boundary's
one reader, `engines.metrics.read_metrics`, in its neutral vocabulary).

Engines renamed metrics across versions; the engine's mapping lists the current name first
and the older alias as a fallback. A reading that lacks the queue gauges is *unusable*, and
the caller treats the replica as saturated, never as idle (the production-stack router reads
removed names as 0 and piles traffic onto busy replicas).
"""

from __future__ import annotations

from inferplane.engines import engine_for, read_metrics
from inferplane.engines import metrics as m
from inferplane.gateway.backend import EngineLoad

_KEYS = (m.REQUESTS_WAITING, m.REQUESTS_RUNNING, m.KV_CACHE_USAGE, m.SLEEP_STATE)
# Every engine the gateway fronts speaks vLLM's metric names (the simulator does too).
_NAMES = engine_for("vllm").metrics


def parse_engine_load(text: str, now: float) -> EngineLoad | None:
    """Sum queue gauges over engines (data parallel ranks), take the highest KV usage.

    Returns None when the text lacks the waiting or running gauge; a missing KV gauge
    reads as full.
    """
    reading = read_metrics(text, _NAMES, _KEYS)
    waiting = reading.total(m.REQUESTS_WAITING)
    running = reading.total(m.REQUESTS_RUNNING)
    if waiting is None or running is None:
        return None
    kv = reading.highest(m.KV_CACHE_USAGE)
    return EngineLoad(
        waiting=waiting,
        running=running,
        kv_usage=1.0 if kv is None else kv,  # unknown KV usage counts as full
        awake=not reading.asleep(),
        read_at=now,
    )
