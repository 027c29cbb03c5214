"""One neutral metric vocabulary and the one reader of an engine's Prometheus `/metrics`.

Each engine maps the neutral names below onto its own (`Engine.metrics`, e.g.
`engines/vllm/metrics.py`), current name first and older aliases after: engines rename
metrics across releases and the first name present wins. The gateway's balancer, the
runtime's `status`, the autoscaler, the bench and the console read engines only through
`read_metrics(text, engine.metrics)`, so a new engine is one mapping, not five parsers.

A figure the engine does not report reads as None (or empty), never as zero: callers decide
what missing means (the balancer treats a replica without queue gauges as saturated).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# Gauges (summed over data-parallel ranks, except KV usage: the highest).
REQUESTS_WAITING = "requests_waiting"
REQUESTS_RUNNING = "requests_running"
KV_CACHE_USAGE = "kv_cache_usage"  # 0..1
SLEEP_STATE = "sleep_state"  # labelled gauge: sleep_state="awake" is 0 while asleep
# Counters (summed over label sets; a `_total` suffix is read as the bare name too).
PROMPT_TOKENS = "prompt_tokens"
GENERATION_TOKENS = "generation_tokens"
REQUESTS_FINISHED = "requests_finished"
PREEMPTIONS = "preemptions"
PREFIX_CACHE_QUERIES = "prefix_cache_queries"
PREFIX_CACHE_HITS = "prefix_cache_hits"
# Histograms (seconds).
TIME_TO_FIRST_TOKEN = "time_to_first_token"
INTER_TOKEN_LATENCY = "inter_token_latency"
TIME_PER_OUTPUT_TOKEN = "time_per_output_token"
QUEUE_TIME = "queue_time"

VOCABULARY = (
    REQUESTS_WAITING, REQUESTS_RUNNING, KV_CACHE_USAGE, SLEEP_STATE, PROMPT_TOKENS,
    GENERATION_TOKENS, REQUESTS_FINISHED, PREEMPTIONS, PREFIX_CACHE_QUERIES,
    PREFIX_CACHE_HITS, TIME_TO_FIRST_TOKEN, INTER_TOKEN_LATENCY, TIME_PER_OUTPUT_TOKEN,
    QUEUE_TIME,
)

# neutral name -> the engine's metric names, preferred first (without `_total`/`_bucket`).
MetricNames = Mapping[str, tuple[str, ...]]

Labelled = list[tuple[dict[str, str], float]]
_SUFFIXES = ("_total", "_bucket", "_sum", "_count")


def _labels(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in text.split('",'):
        key, sep, value = part.partition('="')
        if sep:
            out[key.strip().lstrip(",")] = value.rstrip('"').replace('\\"', '"')
    return out


def _parse(text: str, wanted: frozenset[str]) -> dict[str, Labelled]:
    """Exposition name -> [(labels, value)] for the names in `wanted` (with suffixes)."""
    found: dict[str, Labelled] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
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
        if name not in wanted:
            continue
        parts = rest.split()
        if not parts:
            continue
        try:
            value = float(parts[0])
        except ValueError:
            continue
        found.setdefault(name, []).append((_labels(labels) if labels else {}, value))
    return found


@dataclass(frozen=True)
class Reading:
    """One scrape of one engine, asked in neutral names."""

    names: MetricNames
    samples: Mapping[str, Labelled]  # exposition name -> samples

    def _first(self, key: str, suffixes: tuple[str, ...] = ("",)) -> Labelled | None:
        for name in self.names.get(key, ()):
            hits = [s for suffix in suffixes for s in self.samples.get(name + suffix, ())]
            if hits:
                return hits
        return None

    def labelled(self, key: str) -> Labelled:
        """Every sample of `key` with its labels (the first engine name present)."""
        return self._first(key) or []

    def total(self, key: str) -> float | None:
        """A gauge or counter summed over its label sets; None when not reported."""
        hits = self._first(key, ("", "_total"))
        return None if hits is None else sum(v for _, v in hits)

    def highest(self, key: str) -> float | None:
        hits = self._first(key)
        return None if hits is None else max(v for _, v in hits)

    def histogram(self, key: str) -> tuple[dict[float, float], float, float]:
        """(cumulative count per bucket bound, sum, count), summed over label sets."""
        for name in self.names.get(key, ()):
            buckets: dict[float, float] = {}
            for labels, value in self.samples.get(name + "_bucket", ()):
                bound = labels.get("le")
                if bound is None:
                    continue
                le = math.inf if bound == "+Inf" else float(bound)
                buckets[le] = buckets.get(le, 0.0) + value
            total = sum(v for _, v in self.samples.get(name + "_sum", ()))
            count = sum(v for _, v in self.samples.get(name + "_count", ()))
            if buckets or count:
                return buckets, total, count
        return {}, 0.0, 0.0

    def asleep(self) -> bool:
        """The engine says it sleeps (its awake state reads 0)."""
        return any(labels.get("sleep_state") == "awake" and value == 0
                   for labels, value in self.labelled(SLEEP_STATE))


def read_metrics(text: str, names: MetricNames, keys: Iterable[str] | None = None) -> Reading:
    """Parse `text` (Prometheus exposition) for the neutral `keys` (default: all of them)."""
    wanted = {
        name + suffix
        for key in (VOCABULARY if keys is None else keys)
        for name in names.get(key, ())
        for suffix in ("", *_SUFFIXES)
    }
    return Reading(names, _parse(text, frozenset(wanted)))
