"""A simulated engine on the wall clock: an asyncio task stepping an `EngineCore`.

Steps are computed on a simulated clock that runs at most one tick ahead of the wall
clock; the tokens of a tick are delivered when the wall clock reaches the end of its last
step. Token timestamps (and so every latency metric) are the simulated ones, exact; only
delivery is batched by up to `tick_s`, which keeps 50 busy engines cheap on two cores.
The timing model's per-request serving cost (`request_overhead_s`: API server work around
the GPU's steps) delays every token's delivery by that much, so a client's TTFT and
end-to-end latency include it and its TPOT does not.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Callable

from inferplane.aio import cancel_and_wait
from inferplane.gpus import GIB
from inferplane.sim.build import EngineParts
from inferplane.sim.core import EngineCore, KvCapacity
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
        self, request: SimRequest, queue: asyncio.Queue[TokenEvent] | None = None
    ) -> asyncio.Queue[TokenEvent]:
        """Queue a request (raises ValueError if it can never fit); tokens arrive on the queue.

        Several requests may share one `queue` (the choices of one API call): each event
        names its request."""
        request.arrival_s = asyncio.get_running_loop().time()
        self.core.add(request)
        queue = queue if queue is not None else asyncio.Queue()
        self._streams[request] = queue
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
        if self._streams.pop(request, None) is not None and request.finished_s is None:
            self.core.abort(request)

    def release(self, request: SimRequest) -> None:
        """Forget a finished request's stream."""
        self._streams.pop(request, None)

    # -- the step loop ---------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        tick = self.parts.config.tick_s
        while True:
            if not self.core.has_work:
                self._wake.clear()
                await self._wake.wait()
            now = loop.time()
            self._sim_now = max(self._sim_now, now)
            horizon = now + tick
            events: list[TokenEvent] = []
            while self.core.has_work and self._sim_now < horizon:
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
