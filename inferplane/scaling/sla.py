"""SLA mode: replicas from latency targets, a performance model and the observed mix.

The performance model of one replica is the simulator's step-time model for the model,
GPU and TP (`inferplane.sim.timing`, calibrated on vLLM measurements): a decode
step of `b` sequences with their context costs `step_s(b)`, a prompt's prefill
`prefill_s`. For a mix of `rate` requests/s with `prompt` and `output` tokens:

- the largest batch `b` whose step time (x the online correction) meets the ITL target
  gives one replica's throughput `b / (prefill + output x itl)` requests/s;
- replicas `n = ceil(rate / (throughput x 0.8))` (a queueing margin), raised until the
  predicted TTFT `overhead + prefill / (1 - rho)` (rho the utilization at n) meets the
  TTFT target. `overhead` is the timing model's per-request serving cost
  (`request_overhead_s`: HTTP, tokenization, the first streamed chunk), paid outside the
  GPU's steps: it neither queues nor takes a batch slot, and no replica count removes
  it, so a TTFT target below it is never met (the estimate says so by reaching
  `max_replicas`). Before the engine, each request's input processing (`frontend_s`,
  `sim.frontend.api_server_work_s`: the chat template, or a completions prompt's
  tokenizer) shares its replica's one API-server event loop with the others: processor
  sharing, `frontend_s / (1 - rate / n x frontend_s)` on average (M/G/1-PS), the same
  queue the simulator's live engine and replays run.

The rate and mix are measured at the gateway over the last `max(2 x scale_up_window_s,
2 s)` (arrivals: finished plus the change in flight and queued). The correction is
online: observed ITL (the engines' `vllm:inter_token_latency_seconds`)
over the model's prediction at the observed batch, smoothed; observed TTFT p95 comes from
the engines' `vllm:time_to_first_token_seconds` buckets. Both appear in the decision's
reason next to the prediction.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from inferplane.engines import read_metrics

UTILIZATION = 0.8  # of the ITL-bound throughput, for queueing


@dataclass(frozen=True)
class ReplicaModel:
    step_s: Callable[[int, int], float]  # (decode seqs, context tokens summed) -> seconds
    prefill_s: Callable[[int], float]  # prompt tokens -> seconds
    max_num_seqs: int
    request_overhead_s: float = 0.0  # per request, outside the engine's steps
    frontend_s: float = 0.0  # per request, the API server's input processing (shared)


@dataclass(frozen=True)
class Estimate:
    replicas: int
    batch: int
    itl_s: float
    ttft_s: float
    throughput_per_replica: float


def estimate(model: ReplicaModel, *, rate: float, prompt_tokens: float,
             output_tokens: float, ttft_target_s: float | None, itl_target_s: float | None,
             correction: float = 1.0, max_replicas: int = 1000) -> Estimate:
    """Replicas needed for `rate` requests/s of this mix under the targets."""
    from inferplane.sim.frontend import mean_sojourn_s  # the simulator loads on first use
    prompt = max(1, int(prompt_tokens))
    output = max(1.0, output_tokens)
    context = prompt + int(output / 2)  # the mean context of a sequence while it decodes
    prefill = model.prefill_s(prompt) * correction
    batch = 1
    for b in range(model.max_num_seqs, 0, -1):
        batch = b
        if itl_target_s is None or model.step_s(b, b * context) * correction <= itl_target_s:
            break
    itl = model.step_s(batch, batch * context) * correction
    throughput = batch / (prefill + output * itl)
    overhead = model.request_overhead_s
    if rate <= 0:
        return Estimate(0, batch, itl, overhead + model.frontend_s + prefill, throughput)
    n = max(1, math.ceil(rate / (throughput * UTILIZATION)))
    ttft = overhead + prefill
    while n <= max_replicas:
        rho = rate / (n * throughput) if n else 0.0
        front = mean_sojourn_s(model.frontend_s, rate / n)
        ttft = overhead + front + prefill / (1 - rho) if rho < 1 else math.inf
        if ttft_target_s is None or ttft <= ttft_target_s:
            break
        n += 1
    return Estimate(min(n, max_replicas), batch, itl, ttft, throughput)


def replica_model_for(model_dir: str | None, served: str, *, gpu: str, tp: int,
                      max_num_seqs: int, max_model_len: int | None,
                      api: str = "chat") -> ReplicaModel:
    """The simulator's timing model of one replica (the default profile without a
    readable model directory), for requests to `api` (a gateway's clients: chat, the
    dearer path, unless told otherwise)."""
    from pathlib import Path

    from inferplane.sim.build import build_parts
    from inferplane.sim.config import SimEngineConfig
    from inferplane.sim.frontend import api_server_work_s, coded_renderer
    from inferplane.sim.timing import StepShape

    path = Path(model_dir) if model_dir else None
    parts = build_parts(SimEngineConfig(
        model=served, model_dir=path if path is not None and (path / "config.json").is_file()
        else None, gpu=gpu, tensor_parallel_size=tp, max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
    ))
    timing = parts.timing

    def step_s(seqs: int, context: int) -> float:
        return timing.step_time_s(StepShape(0, seqs, context, context, seqs))

    def prefill_s(tokens: int) -> float:
        return timing.step_time_s(StepShape(tokens, 0, tokens, tokens * (tokens + 1) // 2, 1))

    front = api_server_work_s(timing.calibration, api,
                              coded_renderer(parts.profile.model_type,
                                             parts.config.tokenizer_mode))
    return ReplicaModel(step_s, prefill_s, parts.memory.max_num_seqs,
                        request_overhead_s=timing.request_overhead_s, frontend_s=front)


def histogram(text: str, name: str) -> tuple[dict[float, float], float, float]:
    """(cumulative count per bucket bound, sum, count) of the histogram the engine exports
    as `name`, summed over label sets (data-parallel ranks, replicas); read with the engine
    boundary's one reader."""
    return read_metrics(text, {name: (name,)}, (name,)).histogram(name)


def quantile(delta: dict[float, float], q: float) -> float | None:
    """The bucket bound where the cumulative `delta` counts reach `q` (None: no data)."""
    if not delta:
        return None
    top = max(delta.values())
    if top <= 0:
        return None
    for le in sorted(delta):
        if delta[le] >= q * top:
            return le
    return None


class SlaTracker:
    """One model's observed mix and correction, updated every tick (EWMA)."""

    def __init__(self, model: ReplicaModel, *, ttft_target_s: float | None,
                 itl_target_s: float | None, halflife_s: float) -> None:
        self.model = model
        self.ttft_target_s = ttft_target_s
        self.itl_target_s = itl_target_s
        self.halflife_s = max(halflife_s, 1e-3)
        self.rate = 0.0
        self.prompt_tokens = 512.0  # until observed
        self.output_tokens = 128.0
        self.correction = 1.0
        self.observed_itl_s: float | None = None
        self.observed_ttft_p95_s: float | None = None
        # the window the rate and mix are measured over: long enough to count arrivals
        self.horizon_s = max(4 * self.halflife_s, 2.0)
        self._snaps: deque[tuple[float, float, float, float, float]] = deque()
        self._itl: tuple[float, float] = (0.0, 0.0)
        self._ttft: dict[float, float] = {}

    def update(self, now: float, *, finished: float, prompt_tokens: float,
               completion_tokens: float, backlog: float, itl: tuple[float, float],
               ttft_buckets: dict[float, float], running: float) -> None:
        """Arrivals (finished + in flight + queued) and tokens over the last `horizon_s`
        give the rate and the mix; the ITL correction is smoothed with the half-life."""
        snaps = self._snaps
        snaps.append((now, finished + backlog, finished, prompt_tokens, completion_tokens))
        while len(snaps) > 2 and now - snaps[1][0] >= self.horizon_s:
            snaps.popleft()
        first = snaps[0]
        if len(snaps) == 1:
            self._itl, self._ttft = itl, ttft_buckets
            return
        span = max(now - first[0], 1e-3)
        self.rate = max(0.0, (finished + backlog - first[1]) / span)
        done = finished - first[2]
        if done > 0 and completion_tokens > first[4]:
            self.prompt_tokens = (prompt_tokens - first[3]) / done
            self.output_tokens = (completion_tokens - first[4]) / done
        last_t = snaps[-2][0]
        alpha = 1 - math.exp(-max(now - last_t, 0.0) / self.halflife_s)
        d_sum, d_count = itl[0] - self._itl[0], itl[1] - self._itl[1]
        self._itl = itl
        if d_count > 0 and running >= 1:
            self.observed_itl_s = d_sum / d_count
            b = max(1, round(running))
            context = int(self.prompt_tokens + self.output_tokens / 2)
            predicted = self.model.step_s(b, b * context)
            if predicted > 0:
                ratio = min(4.0, max(0.25, self.observed_itl_s / predicted))
                self.correction += alpha * (ratio - self.correction)
        delta = {le: v - self._ttft.get(le, 0.0) for le, v in ttft_buckets.items()}
        self._ttft = ttft_buckets
        p95 = quantile(delta, 0.95)
        if p95 is not None:
            self.observed_ttft_p95_s = p95

    def estimate(self, max_replicas: int) -> tuple[Estimate, str]:
        e = estimate(self.model, rate=self.rate, prompt_tokens=self.prompt_tokens,
                     output_tokens=self.output_tokens, ttft_target_s=self.ttft_target_s,
                     itl_target_s=self.itl_target_s, correction=self.correction,
                     max_replicas=max_replicas)
        seen_ttft = (f"{self.observed_ttft_p95_s:.3g} s" if self.observed_ttft_p95_s
                     is not None else "-")
        seen_itl = (f"{self.observed_itl_s * 1000:.3g} ms" if self.observed_itl_s
                    is not None else "-")
        note = (f"rate {self.rate:.2f}/s, {self.prompt_tokens:.0f}+{self.output_tokens:.0f} "
                f"tokens; predicted TTFT {e.ttft_s:.3g} s, ITL {e.itl_s * 1000:.3g} ms at "
                f"batch {e.batch}; observed TTFT p95 {seen_ttft}, ITL {seen_itl}; "
                f"correction x{self.correction:.2f}")
        return e, note
