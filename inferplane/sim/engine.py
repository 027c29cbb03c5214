"""A simulated engine on the wall clock: an asyncio task stepping an `EngineCore`.

Steps are computed on a simulated clock that runs at most one tick ahead of the wall
clock; the tokens of a tick are delivered when the wall clock reaches the end of its last
step. Token timestamps (and so every latency metric) are the simulated ones, exact; only
delivery is batched by up to `tick_s`, which keeps 50 busy engines cheap on two cores.
The timing model's per-request serving cost (`request_overhead_s`: API server work around
the GPU's steps) delays every token's delivery by that much, so a client's TTFT and
end-to-end latency include it and its TPOT does not. Before that, an API call's input
processing (`frontend.api_server_work_s`: a chat template, or the tokenizer of a
completions prompt) runs on the API server's one event loop, shared with the calls in
that phase (`frontend.ProcessorSharing`, on the simulated clock): its choices reach the
engine core at the first step boundary after it is through, as in the offline replays.
An engine that was idle starts its simulated clock at the first arrival (or the first
call through the front end), not when the task woke, so the simulated timestamps do not
depend on how late the event loop ran it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
import uuid
from collections.abc import Callable, Sequence

from inferplane.aio import cancel_and_wait
from inferplane.gpus import GIB
from inferplane.sim.build import EngineParts
from inferplane.sim.core import EngineCore, KvCapacity
from inferplane.sim.frontend import ProcessorSharing, api_server_work_s, coded_renderer
from inferplane.sim.lora import SimAdapters
from inferplane.sim.metrics import EngineMetrics
from inferplane.sim.scheduler import SimRequest, TokenEvent
from inferplane.sim.sleep import SleepState


class SimEngine:
    """One engine's state: core, metrics, sleep mode and fault counters."""

    def __init__(self, parts: EngineParts) -> None:
        self.parts = parts
        config = parts.config
        memory = parts.memory
        self.model_name = config.model
        self.max_model_len = memory.max_model_len
        lora = config.lora
        self.metrics = EngineMetrics(config.model, memory.max_model_len,
                                     lora.max_loras if lora is not None else None)
        # --enable-lora (sim/lora.py); TP > 1 runs vLLM's multiprocess executor
        self.loras = SimAdapters(lora, config.model, config.tensor_parallel_size > 1)
        self.loras.load_static()
        capacity = KvCapacity(
            num_blocks=memory.num_gpu_blocks,
            block_size=memory.block_size,
            max_num_seqs=memory.max_num_seqs,
            max_num_batched_tokens=memory.max_num_batched_tokens,
            enable_prefix_caching=config.enable_prefix_caching,
            max_loras=lora.max_loras if lora is not None else None,
        )
        self.core = EngineCore(capacity, parts.timing, self.metrics)
        self.created = int(time.time())
        self.started_monotonic = time.monotonic()
        self.sleeping = False
        self.sleep_state = SleepState(memory.weights_gib * GIB)  # vLLM sleep mode (sleep.py)
        self.requests_seen = 0
        self.tokens_streamed = 0  # for the die_after_tokens fault
        self.dead = False  # the engine core died (die_after_tokens): as vLLM, never recovers
        self.on_death: Callable[[], None] | None = None
        self.random = random.Random(config.faults.seed)
        self._streams: dict[SimRequest, asyncio.Queue[TokenEvent]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._sim_now = 0.0
        # The API server's input processing: one job per API call, its choices
        self.front: ProcessorSharing[tuple[SimRequest, ...]] = ProcessorSharing()
        self.coded_chat = coded_renderer(parts.profile.model_type, config.tokenizer_mode)
        self._in_front: set[SimRequest] = set()
        self._ready_s = math.inf  # earliest arrival the idle engine has not started on

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    @property
    def ready(self) -> bool:
        elapsed = time.monotonic() - self.started_monotonic
        return elapsed >= self.parts.config.faults.load_time_s

    def new_request_id(self, prefix: str, base: str | None = None) -> str:
        """`prefix-<base>`, as vLLM forms ids: `base` is the client's X-Request-Id when it sent
        one, else a random uuid4 hex, so ids never repeat across replicas or restarts."""
        return f"{prefix}-{base or uuid.uuid4().hex}"

    # -- requests --------------------------------------------------------------------

    def submit(
        self, request: SimRequest, queue: asyncio.Queue[TokenEvent] | None = None,
        endpoint: str | None = None,
    ) -> asyncio.Queue[TokenEvent]:
        """Queue a request (raises ValueError if it can never fit); tokens arrive on the queue.

        Several requests may share one `queue` (the choices of one API call): each event
        names its request. `endpoint` ("chat", "completions") sets the API server's input
        processing it waits for first (`frontend.api_server_work_s`); None: none."""
        return self.submit_call([request], queue, endpoint)

    def submit_call(
        self, requests: Sequence[SimRequest], queue: asyncio.Queue[TokenEvent] | None = None,
        endpoint: str | None = None,
    ) -> asyncio.Queue[TokenEvent]:
        """The choices of one API call: one arrival, one pass through the API server (vLLM
        renders and tokenizes a call once for all its `n` choices), one shared queue."""
        for request in requests:
            self.core.scheduler.check(request)
        now = asyncio.get_running_loop().time()
        queue = queue if queue is not None else asyncio.Queue()
        for request in requests:
            request.arrival_s = now
            self._streams[request] = queue
        work = api_server_work_s(self.core.timing.calibration, endpoint, self.coded_chat)
        if work > 0:
            self.front.submit(tuple(requests), now, work)
            self._in_front.update(requests)
        else:
            for request in requests:
                self.core.add(request)
        self._ready_s = min(self._ready_s, now)
        self._wake.set()
        return queue

    def count_streamed_token(self) -> None:
        """One token sent on a stream; the die_after_tokens fault fires here."""
        self.tokens_streamed += 1
        limit = self.parts.config.faults.die_after_tokens
        if limit is not None and self.tokens_streamed >= limit and not self.dead:
            self.die()

    def die(self) -> None:
        """The engine core dies: nothing is generated any more, and every request waiting
        for a token is woken to end with vLLM's EngineDeadError."""
        self.dead = True
        if self._task is not None:
            self._task.cancel()
        for request, queue in self._streams.items():
            queue.put_nowait(TokenEvent(request, -1, self._sim_now, finished=False))
        if self.on_death is not None:
            self.on_death()

    def abort(self, request: SimRequest) -> None:
        if self._streams.pop(request, None) is None or request.finished_s is not None:
            return
        if request in self._in_front:
            # Still in the API server: its work goes on (vLLM's handler renders the call
            # before it reaches the engine), and the engine core never sees it.
            self._in_front.discard(request)
            return
        self.core.abort(request)

    def release(self, request: SimRequest) -> None:
        """Forget a finished request's stream."""
        self._streams.pop(request, None)

    # -- the step loop ---------------------------------------------------------------

    def _admit(self, until_s: float) -> None:
        """API calls through the front end by `until_s` enter the engine core (those of
        their choices whose client is still there)."""
        for call, _ in self.front.advance(until_s):
            for request in call:
                if request in self._in_front:
                    self._in_front.discard(request)
                    self.core.add(request)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        tick = self.parts.config.tick_s
        while True:
            idle = not self.core.has_work
            if idle:
                self._wake.clear()
                due = self.front.next_done_s()
                if due is None:
                    await self._wake.wait()
                elif due > loop.time() + tick:
                    with contextlib.suppress(TimeoutError):  # the front end's next call is due
                        await asyncio.wait_for(self._wake.wait(), due - tick - loop.time())
            now = loop.time()
            # Idle until now: start at the first arrival or call through the front end,
            # however late this task woke.
            due = self.front.next_done_s()
            start = min(now, self._ready_s, math.inf if due is None else due) if idle else now
            self._ready_s = math.inf
            self._sim_now = max(self._sim_now, start)
            horizon = now + tick
            events: list[TokenEvent] = []
            while self._sim_now < horizon:
                self._admit(self._sim_now)
                if not self.core.has_work:
                    due = self.front.next_done_s()
                    if due is None or due >= horizon:
                        break
                    self._sim_now = max(self._sim_now, due)
                    continue
                duration, produced = self.core.step(self._sim_now)
                self._sim_now += duration
                events.extend(produced)
            delay = self._sim_now - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)  # let handlers run even when steps are free
            overhead = self.core.timing.request_overhead_s
            for event in events:
                queue = self._streams.get(event.request)
                if queue is None:
                    continue
                if overhead > 0:
                    loop.call_later(overhead, queue.put_nowait, event)
                else:
                    queue.put_nowait(event)
