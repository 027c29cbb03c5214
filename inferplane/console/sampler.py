"""The console's live charts: the gateway's own metrics and every engine's `/metrics`,
sampled every `interval_s` into a bounded ring buffer (`/ui/api/series` serves it).

One point per interval holds, per model, what the gateway saw (requests/s, errors by
status, queue depth and mean wait, upstream TTFT percentiles, tokens/s, in flight) and
what its engines report (waiting, running); per replica, the gateway's requests/s and in
flight beside the engine's KV-cache usage (the load signal, P47), prefix-cache hit rate,
TTFT/TPOT percentiles and generation tokens/s. An engine that does not answer has
`live: false` and no engine numbers, never zeros. The sampler also notes every state
change of an instance (ready -> restarting -> ready) for the models page.

It starts on the first console request and stops with the gateway: a fleet nobody looks
at is never scraped twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

from inferplane.aio import cancel_and_wait
from inferplane.console import series as S
from inferplane.console.source import FleetSource
from inferplane.engines import engine_for, read_metrics
from inferplane.engines import metrics as metric

if TYPE_CHECKING:
    from inferplane.gateway.app import GatewayApp

log = logging.getLogger("inferplane.console")

DEFAULT_INTERVAL_S = 1.0
DEFAULT_CAPACITY = 900  # 15 minutes at one point a second
EVENTS_PER_INSTANCE = 50
_SCRAPE_TIMEOUT = aiohttp.ClientTimeout(total=1.5)
# The engines' metric names from the engine boundary's vocabulary (current name first).
_N = engine_for("vllm").metrics
_KV = _N[metric.KV_CACHE_USAGE]
_TPOT = _N[metric.TIME_PER_OUTPUT_TOKEN]
_WAITING, _RUNNING = _N[metric.REQUESTS_WAITING][0], _N[metric.REQUESTS_RUNNING][0]
_TTFT = _N[metric.TIME_TO_FIRST_TOKEN][0]


@dataclass(frozen=True)
class Replica:
    name: str  # the instance name ("chat-0"), or the backend's URL without a runtime
    model: str
    url: str
    state: str


def _r(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _first(samples: S.Samples, names: tuple[str, ...]) -> str | None:
    return next((n for n in names if n + "_bucket" in samples or n in samples), None)


def _label(key: str, value: str) -> S.Match:
    return lambda labels: labels.get(key) == value


def _labels(**wanted: str) -> S.Match:
    return lambda labels: all(labels.get(k) == v for k, v in wanted.items())


class Sampler:
    def __init__(
        self,
        gateway: GatewayApp,
        source: FleetSource | None,
        interval_s: float = DEFAULT_INTERVAL_S,
        capacity: int = DEFAULT_CAPACITY,
    ) -> None:
        self.gateway = gateway
        self.source = source
        self.interval_s = interval_s
        self.points: deque[dict[str, Any]] = deque(maxlen=capacity)
        self.live: dict[str, dict[str, Any]] = {}  # instance -> latest engine reading
        self.events: dict[str, deque[dict[str, Any]]] = {}
        self._states: dict[str, str] = {}
        self._prev_gateway: S.Samples | None = None
        self._prev_engines: dict[str, S.Samples] = {}
        self._prev_at = 0.0
        self._task: asyncio.Task[None] | None = None

    # ---- lifecycle -------------------------------------------------------------------

    def ensure_started(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _run(self) -> None:
        while True:
            try:
                await self.sample_once()
            except Exception:  # a bad reading must not end the charts
                log.exception("console sampler")
            await asyncio.sleep(self.interval_s)

    # ---- what there is to sample -------------------------------------------------------

    def replicas(self) -> list[Replica]:
        if self.source is not None:
            return [
                Replica(i["name"], i["model"], i["url"], str(i["state"]))
                for i in self.source.status().get("instances", [])
            ]
        return [
            Replica(b.label, name, b.url, "ready" if b.ready else "not ready")
            for name, pool in self.gateway.state.pools.items()
            for b in pool.backends
        ]

    def _note_states(self, replicas: list[Replica], now: float) -> None:
        for rep in replicas:
            before = self._states.get(rep.name)
            if before != rep.state:
                self.events.setdefault(rep.name, deque(maxlen=EVENTS_PER_INSTANCE)).append(
                    {"at": now, "from": before, "to": rep.state}
                )
                self._states[rep.name] = rep.state

    async def _scrape(self, url: str) -> S.Samples | None:
        try:
            async with self.gateway.session().get(url + "/metrics", timeout=_SCRAPE_TIMEOUT) as r:
                if r.status != 200:
                    return None
                text = await r.text()
        except (aiohttp.ClientError, TimeoutError, OSError):
            return None
        reading = read_metrics(text, _N)  # the engine boundary's one reader
        if not reading.samples:
            return None  # nothing an engine reports (or not an exposition): no reading
        return {name: [(tuple(sorted(labels.items())), value) for labels, value in rows]
                for name, rows in reading.samples.items()}

    # ---- one point ---------------------------------------------------------------------

    async def sample_once(self) -> dict[str, Any] | None:
        """Take one reading; returns the new point (None for the very first reading,
        which only sets the baseline that rates are measured from)."""
        now = time.time()
        replicas = self.replicas()
        self._note_states(replicas, now)
        scraped = await asyncio.gather(*(self._scrape(r.url) for r in replicas))
        engines = {r.name: s for r, s in zip(replicas, scraped, strict=True) if s is not None}
        gateway = S.from_families(self.gateway.metrics.registry.collect())
        for rep in replicas:
            samples = engines.get(rep.name)
            if samples is None:
                self.live.pop(rep.name, None)
                continue
            kv = _first(samples, _KV)
            self.live[rep.name] = {
                "at": now,
                "kv_cache_usage": _r(S.peak(samples, kv) if kv else None),
                "waiting": S.total(samples, _WAITING),
                "running": S.total(samples, _RUNNING),
            }
        prev, prev_engines, dt = self._prev_gateway, self._prev_engines, now - self._prev_at
        self._prev_gateway, self._prev_engines, self._prev_at = gateway, engines, now
        if prev is None or dt <= 0:
            return None
        point: dict[str, Any] = {
            "t": round(now, 3),
            "dt_s": round(dt, 6),  # the interval the rates are over
            "models": {
                m: self._model(m, prev, gateway, dt)
                for m in sorted({*self.gateway.state.pools, *(r.model for r in replicas)})
            },
            "replicas": {
                r.name: self._replica(r, prev, gateway, prev_engines.get(r.name),
                                      engines.get(r.name), dt)
                for r in replicas
            },
        }  # fmt: skip
        for name, model in point["models"].items():
            mine = [point["replicas"][r.name] for r in replicas if r.model == name]
            live = [r for r in mine if r["live"]]
            model["engine_waiting"] = sum(r["waiting"] or 0 for r in live) if live else None
            model["engine_running"] = sum(r["running"] or 0 for r in live) if live else None
        self.points.append(point)
        return point

    def _model(self, model: str, prev: S.Samples, now: S.Samples, dt: float) -> dict[str, Any]:
        is_model = _label("model", model)
        statuses = {
            dict(labels)["status"]
            for labels, _ in now.get("inferplane_requests_total", ())
            if dict(labels).get("model") == model
        }
        errors = {}
        for status in sorted(statuses):
            if status.isdigit() and int(status) >= 400:
                per_s = S.rate(prev, now, "inferplane_requests_total", dt,
                               _labels(model=model, status=status))
                if per_s > 0:
                    errors[status] = _r(per_s)
        ttft_now = S.buckets(now, "inferplane_upstream_ttft_seconds", is_model)
        ttft_before = S.buckets(prev, "inferplane_upstream_ttft_seconds", is_model)
        waits = S.rate(prev, now, "inferplane_queue_wait_seconds_count", dt, is_model)
        wait_sum = S.rate(prev, now, "inferplane_queue_wait_seconds_sum", dt, is_model)
        return {
            "requests_per_s": _r(S.rate(prev, now, "inferplane_requests_total", dt, is_model)),
            "errors_per_s": errors,
            "queue_depth": S.total(now, "inferplane_queue_depth", is_model) or 0,
            "queue_wait_mean_s": _r(wait_sum / waits if waits > 0 else None, 6),
            "in_flight": S.total(now, "inferplane_requests_in_flight", is_model) or 0,
            "ttft_p50_s": _r(S.quantile(0.5, ttft_before, ttft_now), 6),
            "ttft_p95_s": _r(S.quantile(0.95, ttft_before, ttft_now), 6),
            "ttft_p99_s": _r(S.quantile(0.99, ttft_before, ttft_now), 6),
            "tokens_per_s": _r(S.rate(prev, now, "inferplane_tokens_total", dt, is_model), 2),
        }

    def _replica(
        self, rep: Replica, prev: S.Samples, now: S.Samples, engine_before: S.Samples | None,
        engine: S.Samples | None, dt: float,
    ) -> dict[str, Any]:  # fmt: skip
        mine = _label("replica", rep.name)  # the gateway's metrics name replicas, not URLs
        out: dict[str, Any] = {
            "model": rep.model,
            "state": rep.state,
            "requests_per_s": _r(S.rate(prev, now, "inferplane_requests_total", dt, mine)),
            "in_flight": S.total(now, "inferplane_requests_in_flight", mine) or 0,
            "live": engine is not None,
            "waiting": None, "running": None, "kv_cache_usage": None, "prefix_hit_rate": None,
            "ttft_p50_s": None, "ttft_p95_s": None, "tpot_p50_s": None, "tpot_p95_s": None,
            "generation_tokens_per_s": None, "preemptions_per_s": None,
        }  # fmt: skip
        if engine is None:
            return out
        before = engine_before or {}
        kv = _first(engine, _KV)
        queries = S.rate(before, engine, _N[metric.PREFIX_CACHE_QUERIES][0] + "_total", dt)
        hits = S.rate(before, engine, _N[metric.PREFIX_CACHE_HITS][0] + "_total", dt)
        ttft_n = S.buckets(engine, _TTFT)
        ttft_b = S.buckets(before, _TTFT)
        tpot = _first(engine, _TPOT)
        tpot_n = S.buckets(engine, tpot) if tpot else {}
        tpot_b = S.buckets(before, tpot) if tpot else {}
        out.update(
            waiting=S.total(engine, _WAITING),
            running=S.total(engine, _RUNNING),
            kv_cache_usage=_r(S.peak(engine, kv) if kv else None),
            prefix_hit_rate=_r(hits / queries if queries > 0 else None),
            ttft_p50_s=_r(S.quantile(0.5, ttft_b, ttft_n), 6) if engine_before else None,
            ttft_p95_s=_r(S.quantile(0.95, ttft_b, ttft_n), 6) if engine_before else None,
            tpot_p50_s=_r(S.quantile(0.5, tpot_b, tpot_n), 6) if engine_before else None,
            tpot_p95_s=_r(S.quantile(0.95, tpot_b, tpot_n), 6) if engine_before else None,
            generation_tokens_per_s=_r(
                S.rate(before, engine, _N[metric.GENERATION_TOKENS][0] + "_total", dt), 2
            ) if engine_before else None,
            preemptions_per_s=_r(S.rate(before, engine, _N[metric.PREEMPTIONS][0] + "_total", dt))
            if engine_before else None,
        )  # fmt: skip
        return out

    def since(self, t: float) -> list[dict[str, Any]]:
        return [p for p in self.points if p["t"] > t]
