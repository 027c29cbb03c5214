"""The gateway's pending metrics fold into prometheus-client exactly as direct updates."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from inferplane.gateway.metrics import GatewayMetrics, PendingHistogram

_BUCKETS = (0.001, 0.01, 0.1, 1.0, 10.0)
values = st.lists(st.floats(min_value=0, max_value=1e4, allow_nan=False), max_size=200)


def _state(child: object) -> tuple[list[float], float]:
    return [b.get() for b in child._buckets], child._sum.get()  # type: ignore[attr-defined]


@given(values, values)
def test_a_pending_histogram_folds_to_what_direct_observations_give(
    first: list[float], second: list[float]
) -> None:
    registry = CollectorRegistry()
    hist = Histogram("h", "h", ["k"], buckets=_BUCKETS, registry=registry)
    direct, batched = hist.labels("direct"), hist.labels("batched")
    pending = PendingHistogram(batched)
    for chunk in (first, second):  # two collections: nothing is counted twice
        for v in chunk:
            direct.observe(v)
            pending.observe(v)
        pending.fold()
        got, want = _state(batched), _state(direct)
        assert got[0] == want[0]
        assert abs(got[1] - want[1]) <= 1e-9 * max(1.0, abs(want[1]))


def _sample(metrics: GatewayMetrics, name: str, labels: dict[str, str]) -> float | None:
    for family in metrics.registry.collect():
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return None


def test_every_collection_sees_the_requests_and_tokens_counted_so_far() -> None:
    metrics = GatewayMetrics(lambda: iter(()))
    series = metrics.series("m", "r")
    for status in (200, 200, 429):
        series.count(status)
    series.duration.observe(0.02)
    metrics.add_tokens("m", 10, 3)
    metrics.observe_queue_wait("m", 0.0)
    labels = {"model": "m", "replica": "r", "status": "200"}
    assert _sample(metrics, "inferplane_requests_total", labels) == 2
    series.count(200)
    metrics.add_tokens("m", 5, 0)
    assert _sample(metrics, "inferplane_requests_total", labels) == 3  # folded once more
    assert _sample(metrics, "inferplane_tokens_total", {"model": "m", "kind": "prompt"}) == 15
    assert _sample(metrics, "inferplane_tokens_total", {"model": "m", "kind": "completion"}) == 3
    assert _sample(metrics, "inferplane_request_duration_seconds_count",
                   {"model": "m", "replica": "r"}) == 1  # fmt: skip
    assert _sample(metrics, "inferplane_queue_wait_seconds_count", {"model": "m"}) == 1
    assert b'inferplane_requests_total{model="m",replica="r",status="429"} 1.0' in (
        metrics.render()
    )
