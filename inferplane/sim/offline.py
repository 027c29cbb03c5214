"""Run a workload through an `EngineCore` on a simulated clock (no sleeping, no HTTP).

Used by the fidelity benchmark and by tests that need deterministic timing. Mirrors
`vllm bench serve`: requests arrive all at once (`request_rate=inf`), at a fixed rate
(evenly spaced or as a Poisson process), or
are issued by `max_concurrency` closed-loop clients. The timing model's per-request serving
cost (`request_overhead_s`, outside the GPU's steps) is what a client sees on top: it
adds to each TTFT, and a closed-loop client sends its next request that much after the
engine finished the last one; the run ends when the last client saw its last token.
With `frontend_s` each request first spends that much of the API server's one event loop,
shared among the requests in that phase (`frontend.ProcessorSharing`), and reaches the
engine at the first step boundary after: a burst of N arrives at the engine together,
about N x frontend_s after it was sent.
"""

from __future__ import annotations

import heapq
import random
import statistics
from collections import deque
from dataclasses import dataclass

from inferplane.sim.core import EngineCore
from inferplane.sim.frontend import ProcessorSharing
from inferplane.sim.scheduler import SimRequest


@dataclass(frozen=True)
class WorkItem:
    prompt_token_ids: list[int]
    output_tokens: int


@dataclass(frozen=True)
class WorkloadResult:
    duration_s: float
    completed: int
    total_output_tokens: int
    output_throughput_tok_s: float
    mean_ttft_s: float
    median_ttft_s: float
    mean_tpot_s: float
    median_tpot_s: float
    peak_waiting: int
    peak_kv_usage: float
    prefix_hit_rate: float
    preemptions: int


def synthetic_prompt(length: int, seed: int) -> list[int]:
    """Distinct token ids per seed, so unrelated prompts share no prefix blocks."""
    return [(seed * 1_000_003 + i * 7919) % 50_000 for i in range(length)]


def _arrival_gaps(n: int, rate: float | None, seed: int | None) -> list[float]:
    if rate is None or n == 0:
        return [0.0] * n
    if seed is None:
        return [1.0 / rate] * n
    rng = random.Random(seed)
    raw = [rng.expovariate(rate) for _ in range(n)]
    scale = n / rate / sum(raw)
    return [g * scale for g in raw]


def run_workload(
    core: EngineCore,
    items: list[WorkItem],
    *,
    max_concurrency: int | None = None,
    request_rate: float | None = None,
    poisson_seed: int | None = None,
    frontend_s: float = 0.0,
) -> WorkloadResult:
    """Simulate `items` to completion; `request_rate=None` means all arrive at t=0.
    With `poisson_seed` the gaps between arrivals are exponential (`vllm bench serve
    --burstiness 1`), seeded, and scaled to average exactly 1/rate (so one draw does not
    shift the run's throughput by its own luck); else they are exactly 1/rate.
    `frontend_s`: the API server's input processing per request (see the module doc)."""
    pending = deque(items)
    gaps = _arrival_gaps(len(items), request_rate, poisson_seed)
    overhead = core.timing.request_overhead_s
    now = 0.0
    next_arrival = 0.0
    in_flight = 0
    releases: list[float] = []  # when finished requests' clients see their last token
    done: list[SimRequest] = []
    peak_waiting = 0
    peak_kv = 0.0
    front: ProcessorSharing[SimRequest] | None = (
        ProcessorSharing(frontend_s) if frontend_s > 0 else None)

    def admit(at: float) -> None:
        nonlocal in_flight
        item = pending.popleft()
        request = SimRequest(
            request_id=f"w{len(items) - len(pending)}",
            prompt_token_ids=item.prompt_token_ids,
            output_tokens=max(1, item.output_tokens),
            finish_reason="length",
            arrival_s=at,
        )
        if front is None:
            core.add(request)
        else:
            front.submit(request, at)
        in_flight += 1

    while pending or core.has_work or front:
        while releases and releases[0] <= now:
            heapq.heappop(releases)
            in_flight -= 1
        # Arrivals up to now.
        while pending and (max_concurrency is None or in_flight < max_concurrency):
            if request_rate is None:
                admit(now)
            elif next_arrival <= now:
                admit(next_arrival)
                next_arrival += gaps[len(items) - len(pending) - 1]
            else:
                break
        if front is not None:
            for request, _ in front.advance(now):
                core.add(request)
        if not core.has_work:
            wake: list[float] = []
            if front:
                wake.append(front.next_done_s() or now)
            if pending and max_concurrency is not None and in_flight >= max_concurrency:
                if releases:
                    wake.append(releases[0])  # every client still reads its last response
            elif pending:
                wake.append(next_arrival)
            now = max(now, min(wake)) if wake else now
            continue
        duration, events = core.step(now)
        now += duration
        peak_waiting = max(peak_waiting, len(core.scheduler.waiting))
        peak_kv = max(peak_kv, core.scheduler.pool.usage)
        for event in events:
            if event.finished:
                done.append(event.request)
                heapq.heappush(releases, now + overhead)

    if done:
        now += overhead  # the last response reaches its client
    ttfts = [r.first_token_s - r.arrival_s + overhead for r in done
             if r.first_token_s is not None]
    tpots = [
        (r.finished_s - r.first_token_s) / (r.num_output - 1)
        for r in done
        if r.finished_s is not None and r.first_token_s is not None and r.num_output > 1
    ]
    output_tokens = sum(r.num_output for r in done)
    prefix = core.scheduler.prefix
    return WorkloadResult(
        duration_s=now,
        completed=len(done),
        total_output_tokens=output_tokens,
        output_throughput_tok_s=output_tokens / now if now > 0 else 0.0,
        mean_ttft_s=statistics.fmean(ttfts) if ttfts else 0.0,
        median_ttft_s=statistics.median(ttfts) if ttfts else 0.0,
        mean_tpot_s=statistics.fmean(tpots) if tpots else 0.0,
        median_tpot_s=statistics.median(tpots) if tpots else 0.0,
        peak_waiting=peak_waiting,
        peak_kv_usage=peak_kv,
        prefix_hit_rate=prefix.hits / prefix.queries if prefix.queries else 0.0,
        preemptions=core.scheduler.num_preemptions,
    )
