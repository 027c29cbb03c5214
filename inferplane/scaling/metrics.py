"""The autoscaler's state in Prometheus, on the gateway's registry (one `/metrics`).

- `inferplane_autoscaler_desired_replicas{model}` / `..._current_replicas{model}` /
  `..._sleeping_replicas{model}` (gauges, read at scrape time);
- `inferplane_autoscaler_last_decision_timestamp_seconds{model,action,reason}`: the last
  decision per model and why (one series per model);
- `inferplane_autoscaler_decisions_total{model,action}`;
- `inferplane_model_cold_starts_total{model,kind}`: kind `start` (a new engine process)
  or `wake` (a sleeping engine woken), counted when requests or the policy need capacity;
- `inferplane_model_hold_seconds{model}`: how long requests were held because no replica
  of their model was awake (scale from zero, wake on request).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

_HOLD_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


@dataclass(frozen=True)
class ModelState:
    model: str
    desired: int
    current: int
    sleeping: int
    last_action: str | None
    last_reason: str | None
    last_at: float | None


class _StateCollector(Collector):
    def __init__(self, read: Callable[[], Iterable[ModelState]]) -> None:
        self._read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        desired = GaugeMetricFamily("inferplane_autoscaler_desired_replicas",
                                    "Replicas the autoscaler wants", labels=["model"])
        current = GaugeMetricFamily("inferplane_autoscaler_current_replicas",
                                    "Awake replicas running or starting", labels=["model"])
        sleeping = GaugeMetricFamily("inferplane_autoscaler_sleeping_replicas",
                                     "Replicas asleep (vLLM sleep mode)", labels=["model"])
        last = GaugeMetricFamily(
            "inferplane_autoscaler_last_decision_timestamp_seconds",
            "When the last decision for the model was made, with its action and reason",
            labels=["model", "action", "reason"],
        )
        for s in self._read():
            desired.add_metric([s.model], s.desired)
            current.add_metric([s.model], s.current)
            sleeping.add_metric([s.model], s.sleeping)
            if s.last_action is not None and s.last_at is not None:
                last.add_metric([s.model, s.last_action, (s.last_reason or "")[:200]],
                                s.last_at)
        yield desired
        yield current
        yield sleeping
        yield last


class ScalingMetrics:
    def __init__(self, registry: CollectorRegistry,
                 read: Callable[[], Iterable[ModelState]]) -> None:
        self.decisions = Counter("inferplane_autoscaler_decisions",
                                 "Scaling decisions made", ["model", "action"],
                                 registry=registry)
        self.cold_starts = Counter(
            "inferplane_model_cold_starts",
            "Engines started or woken because requests or the policy needed capacity",
            ["model", "kind"], registry=registry,
        )
        self.hold = Histogram(
            "inferplane_model_hold_seconds",
            "Time requests were held because no replica of the model was awake",
            ["model"], buckets=_HOLD_BUCKETS, registry=registry,
        )
        registry.register(_StateCollector(read))
