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


def chat_frontend_s(calibration: Calibration, endpoint: str, coded: bool) -> float:
    """The API server's input processing per request for `endpoint` ("chat" or
    "completions"): the chat path's cost (`coded`: a renderer in code, else a Jinja
    template), 0 for completions and for fixed step times (known-answer tests)."""
    if (
        endpoint != "chat"
        or calibration.fixed_prefill_step_s is not None
        or calibration.fixed_decode_step_s is not None
    ):
        return 0.0
    return calibration.chat_renderer_s if coded else calibration.chat_template_s


_EPS = 1e-12


@dataclass
class ProcessorSharing(Generic[T]):
    """Jobs of `work_s` seconds each, served together at an equal share of one server."""

    work_s: float
    now_s: float = 0.0
    _jobs: list[tuple[T, float]] = field(default_factory=list)  # (job, work left)
    # Finished while serving up to an arrival, handed out by the next `advance`.
    _finished: list[tuple[T, float]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self._jobs) + len(self._finished)

    def submit(self, job: T, at_s: float) -> None:
        """A job arrives at `at_s` (one before the last time advanced to counts from then)."""
        self._finished += self._serve(at_s)
        self._jobs.append((job, self.work_s))

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
            step = min(min(left for _, left in self._jobs), (to_s - self.now_s) / n)
            self.now_s += step * n
            remaining = []
            for job, left in self._jobs:
                if left - step <= _EPS:
                    done.append((job, self.now_s))
                else:
                    remaining.append((job, left - step))
            self._jobs = remaining
        self.now_s = max(self.now_s, to_s)
        return done
