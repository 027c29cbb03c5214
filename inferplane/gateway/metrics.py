"""Prometheus metrics in the gateway's own `inferplane_` namespace (never `vllm:`).

Per request the gateway only adds to plain numbers per (model, replica) (`RequestSeries`,
`PendingHistogram`); they are folded into prometheus-client's metrics whenever the registry
is collected, so a scrape reads exact values and the hot path takes no lock. In-flight and
queue depth are read from the live state at scrape time, which costs nothing per request.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300,
)  # fmt: skip


class _LiveCollector(Collector):
    def __init__(self, read: Callable[[], Iterable[tuple[str, str, int, int]]]) -> None:
        self._read = read  # yields (model, replica, in_flight, queue_depth)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        in_flight = GaugeMetricFamily(
            "inferplane_requests_in_flight",
            "Requests sent to a replica and not finished",
            labels=["model", "replica"],
        )
        depth = GaugeMetricFamily(
            "inferplane_queue_depth", "Requests waiting in the gateway queue", labels=["model"]
        )
        seen: set[str] = set()
        for model, replica, flying, queued in self._read():
            in_flight.add_metric([model, replica], flying)
            if model not in seen:
                seen.add(model)
                depth.add_metric([model], queued)
        yield in_flight
        yield depth


class PendingHistogram:
    """One histogram child's observations, counted per bucket in plain ints and folded into
    the child when the registry is collected (`GatewayMetrics.fold`). Per request this is a
    bisect and two additions, where prometheus-client takes a lock per bucket and sum (and
    an uncontended lock is slow once the ledger's writer thread runs)."""

    __slots__ = ("_bounds", "_child", "_counts", "_sum")

    def __init__(self, child: Any) -> None:
        self._child = child
        # prometheus-client's own bucket values (private, stable since 0.4); without them
        # every observation goes straight to the child.
        self._bounds: list[float] | None = (
            list(child._upper_bounds) if hasattr(child, "_buckets") else None
        )
        self._counts = [0] * (len(self._bounds) if self._bounds is not None else 0)
        self._sum = 0.0

    def observe(self, value: float) -> None:
        bounds = self._bounds
        if bounds is None:
            self._child.observe(value)
            return
        self._counts[bisect_left(bounds, value)] += 1  # as prometheus: value <= bound
        self._sum += value

    def fold(self) -> None:
        counts = self._counts
        if self._bounds is None or not any(counts):
            return
        buckets = self._child._buckets
        for i, n in enumerate(counts):
            if n:
                buckets[i].inc(n)
                counts[i] = 0
        self._child._sum.inc(self._sum)
        self._sum = 0.0


class RequestSeries:
    """Per (model, replica): request counts by status and the latency histograms, kept
    in plain numbers and folded into prometheus-client at collection."""

    __slots__ = ("_by_status", "_children", "_requests", "duration", "model", "replica",
                 "ttft")  # fmt: skip

    def __init__(self, m: GatewayMetrics, model: str, replica: str) -> None:
        self.model = model
        self.replica = replica
        self._requests = m.requests
        self._by_status: dict[int, int] = {}
        self._children: dict[int, Any] = {}
        self.ttft = PendingHistogram(m.ttft.labels(model, replica))
        self.duration = PendingHistogram(m.duration.labels(model, replica))

    def count(self, status: int) -> None:
        by_status = self._by_status
        by_status[status] = by_status.get(status, 0) + 1

    def fold(self) -> None:
        for status, n in self._by_status.items():
            if n:
                child = self._children.get(status)
                if child is None:
                    child = self._children[status] = self._requests.labels(
                        self.model, self.replica, str(status)
                    )
                child.inc(n)
        self._by_status.clear()
        self.ttft.fold()
        self.duration.fold()


class _Fold(Collector):
    """Registered first: every collection (scrape, console, autoscaler) folds the pending
    numbers into the metrics before they are read, so readers see exact values."""

    def __init__(self, fold: Callable[[], None]) -> None:
        self._fold = fold

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self._fold()
        return iter(())


class GatewayMetrics:
    def __init__(self, live: Callable[[], Iterable[tuple[str, str, int, int]]]) -> None:
        r = self.registry = CollectorRegistry(auto_describe=False)
        r.register(_Fold(self.fold))
        self.requests = Counter(
            "inferplane_requests",
            "Finished requests by HTTP status (replica '-' when none was reached)",
            ["model", "replica", "status"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "inferplane_queue_wait_seconds",
            "Time spent in the gateway admission queue (0 when not queued)",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "inferplane_upstream_ttft_seconds",
            "Upstream time to first byte (streaming: first chunk; else the full response)",
            ["model", "replica"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            "inferplane_request_duration_seconds",
            "Total time in the gateway, queue included",
            ["model", "replica"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "inferplane_tokens", "Tokens from upstream usage", ["model", "kind"], registry=r
        )
        self.retries = Counter(
            "inferplane_upstream_retries", "Requests retried on another replica", ["model"],
            registry=r,
        )  # fmt: skip
        self.ejections = Counter(
            "inferplane_replica_ejections",
            "Replicas taken out of rotation after consecutive failures",
            ["model", "replica"],
            registry=r,
        )
        self.ejections_refused = Counter(
            "inferplane_replica_ejections_refused",
            "Ejections not made: max_ejection_percent, or the model's last routable replica",
            ["model", "replica"],
            registry=r,
        )
        self.engine_unusable = Counter(
            "inferplane_engine_metrics_unusable",
            "Routing decisions that treated a replica as saturated: metrics missing or stale",
            ["replica", "reason"],
            registry=r,
        )
        r.register(_LiveCollector(live))
        self._series: dict[tuple[str, str], RequestSeries] = {}
        self._queue_wait: dict[str, PendingHistogram] = {}
        self._tokens: dict[str, list[int]] = {}  # model -> [prompt, completion] pending
        self._token_children: dict[tuple[str, str], Any] = {}

    def series(self, model: str, replica: str) -> RequestSeries:
        key = (model, replica)
        s = self._series.get(key)
        if s is None:
            s = self._series[key] = RequestSeries(self, model, replica)
        return s

    def observe_queue_wait(self, model: str, seconds: float) -> None:
        pending = self._queue_wait.get(model)
        if pending is None:
            pending = self._queue_wait[model] = PendingHistogram(self.queue_wait.labels(model))
        pending.observe(seconds)

    def add_tokens(self, model: str, prompt: int, completion: int) -> None:
        pending = self._tokens.get(model)
        if pending is None:
            pending = self._tokens[model] = [0, 0]
        pending[0] += prompt
        pending[1] += completion

    def fold(self) -> None:
        """Move every pending count into prometheus-client (at collection)."""
        for series in list(self._series.values()):
            series.fold()
        for pending in list(self._queue_wait.values()):
            pending.fold()
        for model, counts in list(self._tokens.items()):
            for i, kind in enumerate(("prompt", "completion")):
                if counts[i]:
                    key = (model, kind)
                    child = self._token_children.get(key)
                    if child is None:
                        child = self._token_children[key] = self.tokens.labels(model, kind)
                    child.inc(counts[i])
                    counts[i] = 0

    def render(self) -> bytes:
        return generate_latest(self.registry)
