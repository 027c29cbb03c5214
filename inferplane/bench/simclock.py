"""The simulator's engine core on a simulated clock, for capacity what-ifs.

`simulate` feeds timed arrivals to an `EngineCore` (the same scheduler and step-time
model `inferplane sim` serves with) and advances simulated time step by step: no HTTP, no
sleeping. Runs of identical decode steps - every running request decoding, nothing that
could be admitted - are applied in one jump (the scheduler would do exactly the same steps
one by one: the step times come from the same model, the KV blocks are allocated up
front), which makes a run cost about one Python step per arrival and per finish instead
of one per generated token. With `frontend_s` each request first spends that much of the
API server's one event loop, shared with the requests in that phase, and reaches the
engine at the first step boundary after (`inferplane.sim.frontend`, as the live engine
and the offline replays do).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from inferplane.sim.blocks import block_hashes
from inferplane.sim.core import EngineCore
from inferplane.sim.frontend import ProcessorSharing
from inferplane.sim.scheduler import SimRequest, Status
from inferplane.sim.timing import StepShape

MAX_JUMP_STEPS = 100_000


@dataclass(frozen=True)
class Arrival:
    at_s: float
    prompt_token_ids: list[int]
    output_tokens: int


@dataclass(frozen=True)
class Limits:
    """Stop early once the SLO cannot hold: more than `allowed_violations` measured
    requests over a limit (None: run to the end)."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2el_s: float | None = None
    allowed_violations: int | None = None


@dataclass
class Outcome:
    """Per measured request (arrival index >= `measure_from`), in finish order."""

    ttft_s: list[float] = field(default_factory=list)
    tpot_s: list[float] = field(default_factory=list)
    e2el_s: list[float] = field(default_factory=list)
    completed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    duration_s: float = 0.0
    steps: int = 0
    jumped_steps: int = 0
    preemptions: int = 0
    peak_kv_usage: float = 0.0
    kv_blocked_steps: int = 0  # steps with requests waiting for KV blocks (seats free)
    seq_capped_steps: int = 0  # steps with requests waiting and max_num_seqs running
    budget_capped_steps: int = 0  # waiting while the step's token budget was spent
    violations: int = 0
    stopped_early: bool = False
    prefix_hit_rate: float = 0.0


def _violates(req: SimRequest, limits: Limits, overhead_s: float = 0.0) -> bool:
    """Whether a finished request broke a target; `overhead_s` is the timing model's
    per-request serving cost, which a client sees on top of TTFT and E2E latency."""
    assert req.first_token_s is not None and req.finished_s is not None
    ttft = req.first_token_s - req.arrival_s + overhead_s
    if limits.ttft_s is not None and ttft > limits.ttft_s:
        return True
    if limits.tpot_s is not None and req.num_output > 1:
        tpot = (req.finished_s - req.first_token_s) / (req.num_output - 1)
        if tpot > limits.tpot_s:
            return True
    return (limits.e2el_s is not None
            and req.finished_s - req.arrival_s + overhead_s > limits.e2el_s)


class _Run:
    def __init__(self, core: EngineCore, arrivals: Sequence[Arrival], measure_from: int,
                 limits: Limits, hashes: dict[int, list[int]] | None,
                 measure_until: int | None = None, frontend_s: float = 0.0) -> None:
        self.core = core
        self.front: ProcessorSharing[SimRequest] | None = (
            ProcessorSharing(frontend_s) if frontend_s > 0 else None)
        self.sched = core.scheduler
        self.limits = limits
        self.measure_from = measure_from
        self.measure_until = len(arrivals) if measure_until is None else measure_until
        self.measured_left = max(0, self.measure_until - measure_from)
        self.total = len(arrivals)
        self.pending = deque(enumerate(arrivals))
        self.index: dict[int, int] = {}  # id(request) -> arrival index
        self.out = Outcome()
        self.now = 0.0
        self.hashes = hashes  # arrival index -> block hashes, kept across runs

    def admit_arrivals(self) -> None:
        while self.pending and self.pending[0][1].at_s <= self.now:
            i, arrival = self.pending.popleft()
            request = SimRequest(
                request_id=f"c{i}", prompt_token_ids=arrival.prompt_token_ids,
                output_tokens=max(1, arrival.output_tokens), finish_reason="length",
                arrival_s=arrival.at_s,
            )
            self.index[id(request)] = i
            if self.front is None:
                self.enqueue(request)
            else:
                self.front.submit(request, arrival.at_s)
        if self.front is not None:
            for request, _ in self.front.advance(self.now):
                self.enqueue(request)

    def enqueue(self, request: SimRequest) -> None:
        """The request reaches the engine core."""
        if self.hashes is None:
            self.core.add(request)
        else:
            # Scheduler.add, with the prompt's block hashes computed once per arrival.
            i = self.index[id(request)]
            sched = self.sched
            sched.check(request)
            cached = self.hashes.get(i)
            if cached is None:
                cached = self.hashes[i] = block_hashes(request.prompt_token_ids,
                                                       sched.block_size)
            request.hashes = cached
            sched.waiting.append(request)

    def next_event_s(self) -> float:
        """The next arrival, or the next request through the front end."""
        t = self.pending[0][1].at_s if self.pending else math.inf
        due = self.front.next_done_s() if self.front is not None else None
        return t if due is None else min(t, due)

    def finished(self, request: SimRequest) -> None:
        i = self.index.pop(id(request))
        out = self.out
        out.completed += 1
        out.input_tokens += request.num_prompt_tokens
        out.output_tokens += request.num_output
        if not self.measure_from <= i < self.measure_until:
            return
        self.measured_left -= 1
        assert request.first_token_s is not None and request.finished_s is not None
        overhead = self.core.timing.request_overhead_s
        out.ttft_s.append(request.first_token_s - request.arrival_s + overhead)
        out.e2el_s.append(request.finished_s - request.arrival_s + overhead)
        if request.num_output > 1:
            out.tpot_s.append(
                (request.finished_s - request.first_token_s) / (request.num_output - 1)
            )
        if _violates(request, self.limits, self.core.timing.request_overhead_s):
            out.violations += 1

    def note_waiting(self, steps: int) -> None:
        if not self.sched.waiting:
            return
        sched = self.sched
        if len(sched.running) >= sched.max_num_seqs:
            self.out.seq_capped_steps += steps
            return
        head = sched.waiting[0]
        chunk = min(head.num_tokens - head.num_computed, sched.max_num_batched_tokens)
        if sched.pool.num_free * sched.block_size < chunk:
            self.out.kv_blocked_steps += steps
        else:
            self.out.budget_capped_steps += steps

    def jump(self) -> bool:
        """Apply a run of identical decode steps at once; False when none applies."""
        sched = self.sched
        running = sched.running
        n = len(running)
        if n == 0 or n > sched.max_num_batched_tokens:
            return False
        if sched.waiting and n < sched.max_num_seqs:
            return False  # a waiting request might be admitted next step
        steps = MAX_JUMP_STEPS
        context = 0
        for request in running:
            if request.num_output == 0 or request.num_computed != request.num_tokens - 1:
                return False  # a prefill (chunk) is still running
            steps = min(steps, request.output_tokens - request.num_output)
            context += request.num_computed + 1
        if steps < 2:
            return False
        timing = self.core.timing
        next_arrival = self.next_event_s()
        t = self.now
        prev_t = t
        taken = 0
        window = sched.attention_window
        starts = [r.num_computed + 1 for r in running] if window is not None else []
        for k in range(steps):
            ctx = context + k * n
            prev_t = t
            # A sliding-window model's windowed layers attend to the window at most.
            windowed = sum(min(c + k, window) for c in starts) if window is not None else None
            t += timing.step_time_s(StepShape(0, n, ctx, ctx, n, windowed, windowed))
            taken = k + 1
            if t >= next_arrival:
                break
        bs = sched.block_size
        missing = sum(
            max(0, -(-(r.num_computed + taken) // bs) - len(r.blocks)) for r in running
        )
        if missing > sched.pool.num_free:
            return False  # KV pressure: let the scheduler preempt step by step
        if taken < 2:
            return False
        self.note_waiting(taken)
        for request in list(running):
            grown = sched._grow(request, taken)
            assert grown
            request.num_computed += taken
            request.num_output += taken
            request.prev_token_s = prev_t
            request.last_token_s = t
            if request.num_output >= request.output_tokens:
                sched._finish(request, t)
                self.finished(request)
        self.out.peak_kv_usage = max(self.out.peak_kv_usage, sched.pool.usage)
        self.core.steps += taken
        self.out.jumped_steps += taken
        self.now = t
        return True

    def step(self) -> None:
        duration, events = self.core.step(self.now)
        self.now += duration
        self.note_waiting(1)
        self.out.peak_kv_usage = max(self.out.peak_kv_usage, self.sched.pool.usage)
        for event in events:
            if event.finished:
                self.finished(event.request)

    def run(self) -> Outcome:
        allowed = self.limits.allowed_violations
        while self.pending or self.sched.has_work or self.front:
            self.admit_arrivals()
            if not self.sched.has_work:
                self.now = max(self.now, self.next_event_s())
                continue
            if not self.jump():
                self.step()
            if allowed is not None and self.out.violations > allowed:
                self.out.stopped_early = True
                break
            if allowed is not None and self._hopeless():
                self.out.stopped_early = True
                break
            if self.measured_left == 0 and self.measure_until < self.total:
                break  # every measured request is done; the rest was background load
        out = self.out
        out.duration_s = self.now
        out.steps = self.core.steps
        out.preemptions = self.sched.num_preemptions
        prefix = self.sched.prefix
        out.prefix_hit_rate = prefix.hits / prefix.queries if prefix.queries else 0.0
        return out

    def _hopeless(self) -> bool:
        """Requests waiting longer than the TTFT limit already, more than allowed."""
        limit = self.limits.ttft_s
        allowed = self.limits.allowed_violations
        if limit is None or allowed is None:
            return False
        late = 0
        for request in self.sched.waiting:
            if request.status is Status.WAITING and request.first_token_s is None and (
                self.now - request.arrival_s + self.core.timing.request_overhead_s > limit
                and self.measure_from <= self.index.get(id(request), -1) < self.measure_until
            ):
                late += 1
                if self.out.violations + late > allowed:
                    return True
        return False


def simulate(
    core: EngineCore,
    arrivals: Sequence[Arrival],
    *,
    measure_from: int = 0,
    limits: Limits | None = None,
    hashes: dict[int, list[int]] | None = None,
    measure_until: int | None = None,
    frontend_s: float = 0.0,
) -> Outcome:
    """Run `arrivals` (sorted by time) through `core` until all finish or the SLO is lost.
    `hashes`: a cache of prompt block hashes by arrival index, shared by runs of the same
    arrivals on engines of the same block size (capacity searches). `measure_until`:
    arrivals from this index on are load only, not measured; the run ends once every
    measured request has finished. `frontend_s`: the API server's input processing per
    request (`frontend.api_server_work_s`; see the module doc)."""
    return _Run(core, arrivals, measure_from, limits or Limits(), hashes, measure_until,
                frontend_s).run()
