"""Prometheus samples as plain numbers: flat tables, counter rates, histogram quantiles.

Both the gateway's own registry and an engine's `/metrics` text become a `Samples` table
(name -> [(labels, value)]); two tables taken `dt` seconds apart give rates and the
quantiles of what was observed in between (the `histogram_quantile` of a bucket delta).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

from prometheus_client.metrics_core import Metric

Labels = tuple[tuple[str, str], ...]
Samples = dict[str, list[tuple[Labels, float]]]
Match = Callable[[Mapping[str, str]], bool]


def from_families(families: Iterable[Metric]) -> Samples:
    out: Samples = {}
    for family in families:
        for s in family.samples:
            out.setdefault(s.name, []).append((tuple(sorted(s.labels.items())), float(s.value)))
    return out


def from_text(text: str) -> Samples:
    """An exposition (an engine's /metrics); raises ValueError when it cannot be parsed."""
    from prometheus_client.parser import text_string_to_metric_families

    return from_families(text_string_to_metric_families(text))


def _all(_: Mapping[str, str]) -> bool:
    return True


def total(samples: Samples, name: str, match: Match = _all) -> float | None:
    """The sum over label sets that `match`; None when the metric is absent."""
    rows = samples.get(name)
    if rows is None:
        return None
    return sum(v for labels, v in rows if match(dict(labels)))


def peak(samples: Samples, name: str, match: Match = _all) -> float | None:
    rows = [v for labels, v in samples.get(name, ()) if match(dict(labels))]
    return max(rows) if rows else None


def rate(before: Samples, after: Samples, name: str, dt: float, match: Match = _all) -> float:
    """Per-second increase of a counter; a reset (engine restarted) counts from zero."""
    a = total(after, name, match) or 0.0
    b = total(before, name, match) or 0.0
    return (a - b if a >= b else a) / dt if dt > 0 else 0.0


def buckets(samples: Samples, name: str, match: Match = _all) -> dict[float, float]:
    """Cumulative counts by upper bound of histogram `name` (its `_bucket` series)."""
    out: dict[float, float] = {}
    for labels, value in samples.get(name + "_bucket", ()):
        d = dict(labels)
        if not match(d):
            continue
        le = float(d["le"]) if d.get("le") not in (None, "+Inf") else math.inf
        out[le] = out.get(le, 0.0) + value
    return out


def quantile(q: float, before: dict[float, float], after: dict[float, float]) -> float | None:
    """The q-quantile of the observations between two bucket readings, interpolated
    linearly inside the bucket as Prometheus does; None when nothing was observed."""
    bounds = sorted(after)
    delta = [(le, after[le] - before.get(le, 0.0)) for le in bounds]
    if delta and delta[-1][1] < 0:  # counters reset: the engine restarted in between
        delta = [(le, after[le]) for le in bounds]
    count = delta[-1][1] if delta else 0.0
    if count <= 0:
        return None
    rank = q * count
    lower, below = 0.0, 0.0
    for le, cumulative in delta:
        if cumulative >= rank:
            if math.isinf(le):
                return lower  # above the last finite bound: report that bound
            inside = cumulative - below
            return lower + (le - lower) * ((rank - below) / inside if inside > 0 else 1.0)
        lower, below = le, cumulative
    return lower
