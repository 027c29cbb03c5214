"""Arrival processes, one benchmark run, and the saturation sweep.

Loads (as in `vllm bench serve`): a fixed number of closed-loop clients
(`concurrency`), or open-loop arrivals at `rate` req/s - Poisson, or gamma with a
`burstiness` shape (< 1 burstier, > 1 smoother; 1 is Poisson) - optionally capped at
`concurrency` in flight, or the timestamps of a trace. Every run is bounded by its request
count and `max_duration_s`; requests still running at the limit are cancelled and count
as failed.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from inferplane.aio import cancel_and_wait
from inferplane.bench.client import RequestResult, send
from inferplane.bench.datasets import BenchRequest
from inferplane.bench.metrics import Summary, summarize
from inferplane.errors import InferplaneError

LoadMode = Literal["concurrency", "poisson", "gamma", "trace"]
SATURATION_GAIN = 0.10  # a level that adds less throughput than this is saturated
KNEE_FRACTION = 0.90  # the knee: the smallest level with this share of peak throughput


@dataclass(frozen=True)
class LoadSpec:
    mode: LoadMode = "concurrency"
    concurrency: int | None = None  # clients (concurrency) or a cap in flight (others)
    rate: float | None = None  # req/s for poisson/gamma
    burstiness: float = 1.0
    seed: int = 0

    def check(self) -> None:
        if self.mode == "concurrency" and (self.concurrency is None or self.concurrency < 1):
            raise InferplaneError("needs a concurrency >= 1", field="concurrency",
                                  value=self.concurrency, fix="e.g. --concurrency 8")
        if self.mode in ("poisson", "gamma") and (self.rate is None or self.rate <= 0):
            raise InferplaneError("needs a rate > 0 (req/s)", field="rate", value=self.rate,
                                  fix="e.g. --rate 4")
        if self.burstiness <= 0:
            raise InferplaneError("must be > 0", field="burstiness", value=self.burstiness,
                                  fix="1 is Poisson; < 1 burstier")

    def describe(self) -> str:
        if self.mode == "concurrency":
            return f"concurrency {self.concurrency}"
        if self.mode == "trace":
            return "trace replay"
        cap = f", at most {self.concurrency} in flight" if self.concurrency else ""
        shape = "" if self.mode == "poisson" else f" (gamma, burstiness {self.burstiness:g})"
        return f"{self.rate:g} req/s{shape}{cap}"


def arrival_offsets(requests: Sequence[BenchRequest], load: LoadSpec) -> list[float]:
    """Seconds after the start at which each request is issued (0 for closed loop)."""
    if load.mode == "concurrency":
        return [0.0] * len(requests)
    if load.mode == "trace":
        return [r.arrival_s or 0.0 for r in requests]
    assert load.rate is not None
    rng = random.Random(load.seed)
    shape = 1.0 if load.mode == "poisson" else load.burstiness
    scale = 1.0 / (load.rate * shape)
    offsets, now = [], 0.0
    for _ in requests:
        offsets.append(now)
        now += rng.gammavariate(shape, scale)
    return offsets


@dataclass
class RunResult:
    load: LoadSpec
    summary: Summary
    results: list[RequestResult]
    started_at: float  # unix time
    server: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "load": {
                "mode": self.load.mode, "concurrency": self.load.concurrency,
                "rate_req_s": self.load.rate, "burstiness": self.load.burstiness,
                "description": self.load.describe(),
            },
            "started_at_unix_s": self.started_at,
            **self.summary.as_dict(),
            "server": self.server,
        }


async def run_load(
    base_url: str,
    requests: Sequence[BenchRequest],
    load: LoadSpec,
    *,
    model: str,
    api: str = "completions",
    slo: dict[str, float] | None = None,
    max_duration_s: float = 600.0,
    headers: dict[str, str] | None = None,
    on_done: Callable[[RequestResult], None] | None = None,
    warmup: int = 0,
    warmup_requests: Sequence[BenchRequest] | None = None,
) -> RunResult:
    """Send `requests` to `base_url` with `load`; every request's timing, summarized.
    `warmup`: requests sent one by one first, not counted (connection set-up and the
    server's first-request costs; `vllm bench serve` sends a test prompt): the first of
    `warmup_requests` when given - prompts of their own, so the counted requests do not
    find theirs in the prefix cache - else copies of the first requests."""
    import aiohttp

    load.check()
    offsets = arrival_offsets(requests, load)
    cap = load.concurrency or len(requests) or 1
    gate = asyncio.Semaphore(cap)
    results: list[RequestResult] = []
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=max_duration_s)

    async def one(session: aiohttp.ClientSession, request: BenchRequest, at: float) -> None:
        delay = at - (time.perf_counter() - start)
        if delay > 0:
            await asyncio.sleep(delay)
        async with gate:
            result = await send(session, base_url, request, request.model or model, api=api,
                                headers=headers)
        results.append(result)
        if on_done is not None:
            on_done(result)

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        for request in list(warmup_requests or requests)[:warmup]:
            await send(session, base_url, request, request.model or model, api=api,
                       headers=headers)
        started_at = time.time()
        start = time.perf_counter()
        tasks = [asyncio.ensure_future(one(session, r, at))
                 for r, at in zip(requests, offsets, strict=True)]
        done, pending = await asyncio.wait(tasks, timeout=max_duration_s)
        await cancel_and_wait(*pending)
        for task in done:
            task.result()  # `one` never raises for request errors; surface bugs
    duration = time.perf_counter() - start
    cancelled = len(requests) - len(results)
    results += [
        RequestResult(model=model, prompt_tokens=0, error="cancelled: max_duration_s reached")
        for _ in range(cancelled)
    ]
    return RunResult(load, summarize(results, duration, slo), results, started_at)


@dataclass(frozen=True)
class SweepRow:
    concurrency: int
    run: RunResult

    def as_dict(self) -> dict[str, Any]:
        s = self.run.summary
        return {
            "concurrency": self.concurrency,
            "p50_e2el_ms": s.e2el_ms["p50"], "p99_e2el_ms": s.e2el_ms["p99"],
            "p50_ttft_ms": s.ttft_ms["p50"], "p99_ttft_ms": s.ttft_ms["p99"],
            "p50_tpot_ms": s.tpot_ms["p50"],
            "output_throughput_tok_s": s.output_throughput,
            "request_throughput_req_s": s.request_throughput,
            "request_goodput_req_s": s.request_goodput,
            "completed": s.completed, "failed": s.failed,
        }


@dataclass(frozen=True)
class Sweep:
    rows: list[SweepRow]
    knee: int | None  # the sweet spot: smallest concurrency at 90% of peak throughput
    stopped: str  # why the sweep ended
    best_within_slo: int | None = None  # highest-throughput level whose p99s meet --slo

    def as_dict(self) -> dict[str, Any]:
        return {
            "rows": [r.as_dict() for r in self.rows],
            "knee_concurrency": self.knee,
            "best_within_slo_concurrency": self.best_within_slo,
            "stopped": self.stopped,
            "knee_rule": (f"smallest concurrency with >= {KNEE_FRACTION:.0%} of the peak "
                          f"output throughput; saturated when a doubling adds < "
                          f"{SATURATION_GAIN:.0%}"),
        }


def find_knee(rows: Sequence[tuple[int, float]]) -> int | None:
    """(concurrency, throughput) pairs -> the smallest concurrency at 90% of the peak."""
    usable = [(c, t) for c, t in rows if t > 0]
    if not usable:
        return None
    peak = max(t for _, t in usable)
    return min(c for c, t in usable if t >= KNEE_FRACTION * peak)


async def sweep(
    base_url: str,
    make_requests: Callable[[int], list[BenchRequest]],
    levels: Sequence[int],
    *,
    model: str,
    api: str = "completions",
    slo: dict[str, float] | None = None,
    max_duration_s: float = 600.0,
    headers: dict[str, str] | None = None,
    on_level: Callable[[SweepRow], None] | None = None,
    warmup: int = 0,
    warmup_requests: Sequence[BenchRequest] | None = None,
) -> Sweep:
    """Closed-loop runs at each concurrency until throughput stops growing (two levels in
    a row adding < 10% each), requests fail, or the levels run out. `make_requests(level)`
    should give each level prompts of its own: a level re-sending an earlier level's
    prompts is served from the prefix cache, and its TTFT falls as concurrency rises."""
    rows: list[SweepRow] = []
    stopped = "levels exhausted"
    flat = 0
    for level in levels:
        run = await run_load(
            base_url, make_requests(level), LoadSpec("concurrency", concurrency=level),
            model=model, api=api, slo=slo, max_duration_s=max_duration_s, headers=headers,
            warmup=warmup if not rows else 0, warmup_requests=warmup_requests,
        )
        row = SweepRow(level, run)
        rows.append(row)
        if on_level is not None:
            on_level(row)
        if run.summary.failed:
            stopped = f"{run.summary.failed} request(s) failed at concurrency {level}"
            break
        if len(rows) > 1:
            before = rows[-2].run.summary.output_throughput
            gain = run.summary.output_throughput / before - 1 if before > 0 else 1.0
            flat = flat + 1 if gain < SATURATION_GAIN else 0
            if flat >= 2:
                stopped = f"saturated: throughput flat up to concurrency {level}"
                break
    knee = find_knee([(r.concurrency, r.run.summary.output_throughput) for r in rows
                      if not r.run.summary.failed])
    if knee is not None and rows and knee == rows[-1].concurrency and len(rows) > 1:
        # Nothing past it shows the curve bending: the knee is above the levels run.
        stopped = (f"{stopped}: throughput still growing at concurrency {knee}; "
                   "add higher levels to find the knee")
        knee = None
    return Sweep(rows, knee, stopped, best_within_slo(rows, slo or {}))


def best_within_slo(rows: Sequence[SweepRow], slo: dict[str, float]) -> int | None:
    """The level with the most output throughput whose p99 TTFT/TPOT/E2EL meet `slo`
    (S2's sweet spot: as much throughput as the latency target allows)."""
    keys = {"ttft_ms": "ttft_ms", "tpot_ms": "tpot_ms", "e2el_ms": "e2el_ms"}
    limits = {k: v for k, v in slo.items() if k in keys}
    if not limits:
        return None
    ok = [r for r in rows if not r.run.summary.failed and all(
        getattr(r.run.summary, keys[k])["p99"] <= v for k, v in limits.items())]
    if not ok:
        return None
    return max(ok, key=lambda r: r.run.summary.output_throughput).concurrency
