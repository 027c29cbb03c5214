"""vLLM's API server as a processor-sharing queue in front of the engine core.

vLLM V1 serves HTTP in one asyncio process (`vllm serve`, one API server by default):
every request's input processing (request validation, the chat template, tokenization,
`Processor.process_inputs`) runs as a task on one event loop, which interleaves the tasks
at their awaits. That is processor sharing: n requests in that phase each advance at 1/n
of the loop, so a burst of N requests that each need `work_s` of it reaches the engine
core together, about N x work_s after it was sent, and a lone request `work_s` after
(`vllm/entrypoints/openai/serving_chat.py`: `create_chat_completion` renders the template
in `_preprocess_chat` before `engine_client.generate`). Two chat paths cost differently:
a Jinja chat template (the checkpoint's `tokenizer_config.json`), or a renderer in code,
which gpt-oss always takes (`self.use_harmony = model_config.hf_config.model_type ==
"gpt_oss"`, then `_make_request_with_harmony`) and DeepSeek-V3.2 with `--tokenizer-mode
deepseek_v32` (`vllm/tokenizers/deepseek_v32.py`: `apply_chat_template` calls the Python
`encode_messages`). The engine core drains its input queue
between steps (`EngineCoreProc.run_busy_loop`: `_process_input_queue`, then
`_process_engine_step`), so a request that is through is scheduled at the next step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from inferplane.sim.timing import Calibration

T = TypeVar("T")

# Model types whose chat requests vLLM renders in code (Harmony), whatever the flags.
CODED_RENDERER_MODEL_TYPES = frozenset({"gpt_oss"})
# `--tokenizer-mode` values whose tokenizer renders chat in code, not with Jinja.
CODED_RENDERER_TOKENIZER_MODES = frozenset({"deepseek_v32"})


def coded_renderer(model_type: str, tokenizer_mode: str | None = None) -> bool:
    """True when vLLM renders this model's chat requests without a Jinja template."""
    return (
        model_type in CODED_RENDERER_MODEL_TYPES or tokenizer_mode in CODED_RENDERER_TOKENIZER_MODES
    )


def api_server_work_s(calibration: Calibration, endpoint: str | None, coded: bool) -> float:
    """The API server's input processing per API call to `endpoint`: "chat" pays its chat
    path (`coded`: a renderer in code, else a Jinja template; tokenization included),
    "completions" the tokenizer only (`tokenize_s`); anything else (None: embeddings,
    in-process callers) and fixed step times (known-answer tests) pay nothing. The one
    model of this cost: the live engine (engine.py), the replays (offline.py), capacity's
    clock (bench/simclock.py) and the SLA estimate (scaling/sla.py) all take it from here."""
    if calibration.fixed_prefill_step_s is not None or calibration.fixed_decode_step_s is not None:
        return 0.0
    if endpoint == "chat":
        return calibration.chat_renderer_s if coded else calibration.chat_template_s
    if endpoint == "completions":
        return calibration.tokenize_s
    return 0.0


def mean_sojourn_s(work_s: float, rate: float) -> float:
    """Mean time a job of `work_s` spends in a processor-sharing server that `rate` such
    jobs per second arrive at (Poisson): work / (1 - utilization), M/G/1-PS; inf when
    the server is saturated."""
    if work_s <= 0:
        return 0.0
    rho = rate * work_s
    return work_s / (1.0 - rho) if rho < 1.0 else math.inf


# Work left below this counts as done: far under any modelled cost, and above the
# rounding of an absolute clock (the live engine's loop.time(), ~1e6 s: ulp ~1e-10 s),
# so serving up to a finishing time always finishes the job.
_EPS = 1e-9


@dataclass
class ProcessorSharing(Generic[T]):
    """Jobs served together at an equal share of one server; each needs `work_s` seconds
    of it unless submitted with its own."""

    work_s: float = 0.0
    now_s: float = 0.0
    _jobs: list[tuple[T, float]] = field(default_factory=list)  # (job, work left)
    # Finished while serving up to an arrival, handed out by the next `advance`.
    _finished: list[tuple[T, float]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self._jobs) + len(self._finished)

    def submit(self, job: T, at_s: float, work_s: float | None = None) -> None:
        """A job arrives at `at_s` (one before the last time advanced to counts from then)."""
        self._finished += self._serve(at_s)
        self._jobs.append((job, self.work_s if work_s is None else work_s))

    def next_done_s(self) -> float | None:
        """When the next job would finish if no other arrives; None when empty."""
        if self._finished:
            return self._finished[0][1]
        if not self._jobs:
            return None
        return self.now_s + min(left for _, left in self._jobs) * len(self._jobs)

    def advance(self, to_s: float) -> list[tuple[T, float]]:
        """Serve until `to_s`; the jobs finished on the way (and at arrivals since the
        last call) with their finishing times, in finishing order (arrival order among
        ties)."""
        done, self._finished = self._finished, []
        return done + self._serve(to_s)

    def _serve(self, to_s: float) -> list[tuple[T, float]]:
        done: list[tuple[T, float]] = []
        while self._jobs and to_s > self.now_s:
            n = len(self._jobs)
            least = min(left for _, left in self._jobs)
            if self.now_s + least * n >= to_s:
                # nobody finishes before to_s (but those within _EPS of it): stop there
                step = (to_s - self.now_s) / n
                self.now_s = to_s
            else:  # the least job finishes on the way: each pass ends one or stops
                step = least
                self.now_s += least * n
            remaining = []
            for job, left in self._jobs:
                if left - step <= _EPS:
                    done.append((job, self.now_s))
                else:
                    remaining.append((job, left - step))
            self._jobs = remaining
        self.now_s = max(self.now_s, to_s)
        return done
