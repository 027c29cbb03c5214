"""The engine core: scheduler + step-time model + metrics, advanced one step at a time.

No clock of its own: `step(now_s)` runs one scheduler step that starts at `now_s` and
returns its duration with the tokens it produced. The async engine drives it on the wall
clock; `offline.run_workload` drives it on a simulated clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferplane.sim.metrics import EngineMetrics
from inferplane.sim.scheduler import ScheduledStep, Scheduler, SimRequest, TokenEvent
from inferplane.sim.timing import StepTimeModel


@dataclass(frozen=True)
class KvCapacity:
    """Scheduler limits; from the memory estimator for real model/GPU pairs."""

    num_blocks: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_prefix_caching: bool = True
    max_loras: int | None = None  # distinct adapters per batch (--max-loras); None: no LoRA


class EngineCore:
    def __init__(
        self,
        capacity: KvCapacity,
        timing: StepTimeModel,
        metrics: EngineMetrics | None = None,
    ) -> None:
        self.scheduler = Scheduler(
            num_blocks=capacity.num_blocks,
            block_size=capacity.block_size,
            max_num_seqs=capacity.max_num_seqs,
            max_num_batched_tokens=capacity.max_num_batched_tokens,
            enable_prefix_caching=capacity.enable_prefix_caching,
            max_loras=capacity.max_loras,
            attention_window=timing.cost.sliding_window,
        )
        self.timing = timing
        self.metrics = metrics
        self.steps = 0

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def add(self, request: SimRequest) -> None:
        self.scheduler.add(request)
        if self.metrics is not None:
            self.metrics.record_idle(self.scheduler)

    def abort(self, request: SimRequest) -> None:
        self.scheduler.abort(request)
        if self.metrics is not None:
            self.metrics.record_abort()
            self.metrics.record_idle(self.scheduler)

    def reset_prefix_cache(self) -> None:
        """The KV cache was discarded (sleep): no prefix hits survive it."""
        self.scheduler.pool.reset_cache()

    def step(self, now_s: float) -> tuple[float, list[TokenEvent]]:
        """Run one step starting at `now_s`; return (duration_s, token events)."""
        scheduled: ScheduledStep = self.scheduler.schedule(now_s)
        duration = self.timing.step_time_s(scheduled.shape)
        events = self.scheduler.complete(scheduled, now_s + duration)
        self.steps += 1
        if self.metrics is not None:
            self.metrics.record_step(self.scheduler, scheduled, events)
        return duration, events
