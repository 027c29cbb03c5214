"""Prometheus metrics in the gateway's own `inferplane_` namespace (never `vllm:`).

Label children are cached per (model, replica) so the hot path does dictionary lookups,
not prometheus-client's label resolution. In-flight and queue depth are read from the
live state at scrape time, which costs nothing per request.
"""

from __future__ import annotations

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


class RequestSeries:
    """Cached children for one (model, replica)."""

    __slots__ = ("_by_status", "_requests", "duration", "model", "replica", "ttft")

    def __init__(self, m: GatewayMetrics, model: str, replica: str) -> None:
        self.model = model
        self.replica = replica
        self._requests = m.requests
        self._by_status: dict[int, Any] = {}
        self.ttft = m.ttft.labels(model, replica)
        self.duration = m.duration.labels(model, replica)

    def count(self, status: int) -> None:
        child = self._by_status.get(status)
        if child is None:
            child = self._by_status[status] = self._requests.labels(
                self.model, self.replica, str(status)
            )
        child.inc()


class GatewayMetrics:
    def __init__(self, live: Callable[[], Iterable[tuple[str, str, int, int]]]) -> None:
        r = self.registry = CollectorRegistry(auto_describe=False)
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
        self._queue_wait: dict[str, Any] = {}
        self._tokens: dict[tuple[str, str], Any] = {}

    def series(self, model: str, replica: str) -> RequestSeries:
        key = (model, replica)
        s = self._series.get(key)
        if s is None:
            s = self._series[key] = RequestSeries(self, model, replica)
        return s

    def observe_queue_wait(self, model: str, seconds: float) -> None:
        child = self._queue_wait.get(model)
        if child is None:
            child = self._queue_wait[model] = self.queue_wait.labels(model)
        child.observe(seconds)

    def add_tokens(self, model: str, prompt: int, completion: int) -> None:
        for kind, n in (("prompt", prompt), ("completion", completion)):
            if n:
                key = (model, kind)
                child = self._tokens.get(key)
                if child is None:
                    child = self._tokens[key] = self.tokens.labels(model, kind)
                child.inc(n)

    def render(self) -> bytes:
        return generate_latest(self.registry)
