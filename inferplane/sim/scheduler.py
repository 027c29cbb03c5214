"""Continuous batching in scheduler steps, after vLLM v1's `Scheduler.schedule`.

Each step spends a token budget (`max_num_batched_tokens`): running requests first (one
token for a decode, a chunk for an unfinished prefill), then waiting requests in arrival
order while `max_num_seqs` and KV blocks allow (with LoRA, a waiting request whose adapter
would make the batch hold more than `max_loras` distinct adapters is skipped, as vLLM
does). When a running request needs a block and none is free, the most recently admitted
running request is preempted: its blocks are freed and it goes back to the front of the
queue to be recomputed. Time is passed in, so the scheduler runs the same on the wall
clock and on a simulated one.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from inferplane.sim.blocks import BlockPool, block_hashes
from inferplane.sim.timing import StepShape


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class SimRequest:
    """One request's lengths and progress. `output_tokens` is how many it will generate."""

    request_id: str
    prompt_token_ids: list[int]
    output_tokens: int
    finish_reason: str  # reported when `output_tokens` are generated: "length" or "stop"
    arrival_s: float
    max_tokens_param: int = 0
    lora: str | None = None  # the adapter it runs with (None: the base model)
    status: Status = Status.WAITING
    num_computed: int = 0
    num_output: int = 0
    blocks: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)
    num_cached_blocks: int = 0  # prompt blocks already registered in the prefix cache
    cached_tokens: int = 0  # prefix-cache hit on first scheduling (usage.cached_tokens)
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    prev_token_s: float | None = None  # the token before the latest (for inter-token latency)
    finished_s: float | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Tokens whose KV must exist before the next token can be sampled."""
        return self.num_prompt_tokens + self.num_output


@dataclass(frozen=True)
class TokenEvent:
    """A sampled token (or the end of a request) at simulated time `time_s`."""

    request: SimRequest
    index: int  # 0-based position among output tokens
    time_s: float
    finished: bool


@dataclass
class ScheduledStep:
    """Work of one step: tokens per request, the shape for timing, preemptions."""

    work: list[tuple[SimRequest, int]]
    shape: StepShape
    preempted: int


@dataclass
class PrefixStats:
    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # of those, found in the cache


class Scheduler:
    """vLLM-v1-style scheduler over a `BlockPool`."""

    def __init__(
        self,
        *,
        num_blocks: int,
        block_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_prefix_caching: bool = True,
        max_loras: int | None = None,
        attention_window: int | None = None,
    ) -> None:
        self.max_loras = max_loras
        # The model's sliding window: steps also count the context each sequence's
        # windowed layers attend to (StepShape.windowed_*).
        self.attention_window = attention_window  # None: LoRA off (no adapter limit to keep)
        self.pool = BlockPool(num_blocks, enable_caching=enable_prefix_caching)
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.prefix = PrefixStats()
        self.num_preemptions = 0

    def check(self, request: SimRequest) -> None:
        """Refuse (ValueError) a request that could never fit in the whole KV pool."""
        needed = self._blocks_for(request.num_prompt_tokens + request.output_tokens)
        if needed > self.pool.num_blocks:
            raise ValueError(
                f"request needs {needed} KV blocks but the pool has {self.pool.num_blocks}"
            )

    def add(self, request: SimRequest) -> None:
        """Queue a request; refuse one that could never fit in the whole KV pool."""
        self.check(request)
        request.hashes = block_hashes(request.prompt_token_ids, self.block_size)
        self.waiting.append(request)

    def abort(self, request: SimRequest) -> None:
        """Drop a request (client went away); its blocks go back to the pool."""
        if request.status is Status.RUNNING:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.pool.release(request.blocks)
        request.blocks = []
        request.status = Status.FINISHED

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, now_s: float) -> ScheduledStep:
        budget = self.max_num_batched_tokens
        work: list[tuple[SimRequest, int]] = []
        preempted = 0
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            count = min(request.num_tokens - request.num_computed, budget)
            if not self._grow(request, count):
                # Free blocks by preempting from the back until this request fits.
                while not self._grow(request, count):
                    victim = self.running.pop()
                    self._preempt(victim)
                    preempted += 1
                    if victim is request:
                        break
                if request.status is not Status.RUNNING:
                    break
            work.append((request, count))
            budget -= count
            index += 1
        if preempted == 0:
            budget = self._admit(now_s, budget, work)
        return ScheduledStep(work=work, shape=self._shape(work, self.attention_window),
                             preempted=preempted)

    def complete(self, step: ScheduledStep, end_s: float) -> list[TokenEvent]:
        """Apply a finished step: advance progress, sample tokens, finish requests."""
        events: list[TokenEvent] = []
        for request, count in step.work:
            if request.status is not Status.RUNNING:
                continue  # aborted while the step ran
            request.num_computed += count
            self._cache_full_blocks(request)
            if request.num_computed < request.num_tokens:
                continue  # a prefill chunk; no token yet
            index = request.num_output
            request.num_output += 1
            if request.first_token_s is None:
                request.first_token_s = end_s
            request.prev_token_s = request.last_token_s
            request.last_token_s = end_s
            finished = request.num_output >= request.output_tokens
            if finished:
                self._finish(request, end_s)
            events.append(TokenEvent(request, index, end_s, finished))
        return events

    # -- internals -------------------------------------------------------------------

    def _admit(self, now_s: float, budget: int, work: list[tuple[SimRequest, int]]) -> int:
        limit = self.max_loras
        loras = {r.lora for r in self.running if r.lora is not None} if limit else set()
        skipped: list[SimRequest] = []  # their adapter has no slot this step (vLLM skips)
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            request = self.waiting[0]
            if limit and request.lora is not None and request.lora not in loras and (
                len(loras) >= limit
            ):
                skipped.append(self.waiting.popleft())
                continue
            hit_blocks: list[int] = []
            if not request.blocks:
                # Never a full-prompt hit: the last token is always computed (vLLM).
                usable = (request.num_prompt_tokens - 1) // self.block_size
                hit_blocks = self.pool.cached_prefix(request.hashes[:usable])
                self.pool.take(hit_blocks)
                request.blocks = list(hit_blocks)
                request.num_computed = len(hit_blocks) * self.block_size
                request.num_cached_blocks = len(hit_blocks)
            count = min(request.num_tokens - request.num_computed, budget)
            if not self._grow(request, count):
                self.pool.release(request.blocks)
                request.blocks = []
                request.num_computed = 0
                request.num_cached_blocks = 0
                break
            self.prefix.queries += request.num_prompt_tokens
            self.prefix.hits += len(hit_blocks) * self.block_size
            if request.first_scheduled_s is None:
                request.first_scheduled_s = now_s
                request.cached_tokens = len(hit_blocks) * self.block_size
            self.waiting.popleft()
            request.status = Status.RUNNING
            self.running.append(request)
            work.append((request, count))
            budget -= count
            if request.lora is not None:
                loras.add(request.lora)
        self.waiting.extendleft(reversed(skipped))
        return budget

    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    def _grow(self, request: SimRequest, count: int) -> bool:
        missing = self._blocks_for(request.num_computed + count) - len(request.blocks)
        if missing <= 0:
            return True
        fresh = self.pool.allocate(missing)
        if fresh is None:
            return False
        request.blocks.extend(fresh)
        return True

    def _preempt(self, request: SimRequest) -> None:
        self.pool.release(request.blocks)
        request.blocks = []
        request.num_computed = 0
        request.num_cached_blocks = 0
        request.status = Status.WAITING
        self.waiting.appendleft(request)
        self.num_preemptions += 1

    def _finish(self, request: SimRequest, end_s: float) -> None:
        self.running.remove(request)
        self.pool.release(request.blocks)
        request.blocks = []
        request.status = Status.FINISHED
        request.finished_s = end_s

    def _cache_full_blocks(self, request: SimRequest) -> None:
        full = min(request.num_computed, request.num_prompt_tokens) // self.block_size
        for i in range(request.num_cached_blocks, full):
            self.pool.cache(request.blocks[i], request.hashes[i])
        request.num_cached_blocks = max(request.num_cached_blocks, full)

    @staticmethod
    def _shape(work: list[tuple[SimRequest, int]], window: int | None = None) -> StepShape:
        prefill = decode = context = pairs = 0
        w_context = w_pairs = 0
        for request, count in work:
            if count == 1 and request.num_output > 0 and (
                request.num_computed == request.num_tokens - 1
            ):
                decode += 1
            else:
                prefill += count
            context += request.num_computed + count
            pairs += count * request.num_computed + count * (count + 1) // 2
            if window is not None:
                c = request.num_computed
                w_context += min(c + count, window)
                w_pairs += _windowed_pairs(c, count, window)
        return StepShape(
            prefill_tokens=prefill,
            decode_seqs=decode,
            context_tokens=context,
            attention_pairs=pairs,
            num_seqs=len(work),
            windowed_context_tokens=w_context if window is not None else None,
            windowed_attention_pairs=w_pairs if window is not None else None,
        )


def _windowed_pairs(computed: int, count: int, window: int) -> int:
    """Sum over query positions computed+1 .. computed+count of min(position, window)."""
    below = max(0, min(count, window - computed))  # positions still inside the window
    return below * computed + below * (below + 1) // 2 + (count - below) * window
