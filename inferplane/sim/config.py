"""Settings of one simulated engine: what `inferplane sim` flags and fleet files set."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from inferplane.sim.timing import DEFAULT_CALIBRATION, Calibration

DEFAULT_GPU = "H100-SXM-80GB"


@dataclass(frozen=True)
class FaultConfig:
    """Misbehaviour on command, for testing supervisors, gateways and dashboards.

    load_time_s: /health answers 503 (and the API refuses) until this many seconds passed.
    fail_rate: fraction of generation requests answered with HTTP 500 (seeded, repeatable).
    crash_after_requests: after this many requests the engine stops listening (the
        single-engine CLI process exits with code 1).
    hang_after_requests: after this many requests every endpoint, /health included, hangs
        without answering; the port stays open.
    slowdown: every scheduler step takes this many times longer.
    die_after_tokens: once this many tokens were streamed in all, the engine core dies as
        real vLLM's does (EngineDeadError): streams in flight end with vLLM's error event
        and `data: [DONE]` (their HTTP 200 already sent), other requests get that error as
        a 500, /health answers 503, and a second later the single-engine CLI process exits
        with code 0.
    """

    load_time_s: float = 0.0
    fail_rate: float = 0.0
    crash_after_requests: int | None = None
    hang_after_requests: int | None = None
    slowdown: float = 1.0
    die_after_tokens: int | None = None
    seed: int = 0


@dataclass(frozen=True)
class SimLoraConfig:
    """vLLM's LoRA options (`--enable-lora` and its companions) of one simulated engine.

    `modules` are `--lora-modules` (name, path) pairs loaded at start; `runtime_updates` is
    VLLM_ALLOW_RUNTIME_LORA_UPDATING (the load/unload endpoints exist only with it);
    `load_time_s` is what reading one adapter from disk takes (None: from its file size).
    """

    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None  # None: max_loras, as vLLM
    modules: tuple[tuple[str, str], ...] = ()
    runtime_updates: bool = False
    load_time_s: float | None = None

    @property
    def cpu_slots(self) -> int:
        return self.max_cpu_loras if self.max_cpu_loras is not None else self.max_loras


@dataclass(frozen=True)
class SimEngineConfig:
    """One simulated vLLM engine. `model` is the served model name clients send.

    The model's architecture comes from `model_dir` (config.json, tokenizer.json), else
    `model_config` (a config.json path), else the built-in default profile (Qwen3-0.6B
    shape, see `inferplane.sim.build.DEFAULT_PROFILE_CONFIG`).
    """

    model: str
    model_dir: Path | None = None
    model_config: Path | None = None
    gpu: str = DEFAULT_GPU
    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float = 0.9
    # The planner's explicit KV pool for an instance sharing its GPU (vLLM's
    # --kv-cache-memory-bytes): the simulated engine then holds exactly that many blocks.
    kv_cache_memory_bytes: int | None = None
    enable_prefix_caching: bool = True
    host: str = "127.0.0.1"
    port: int = 0  # 0 = any free port; the handle reports the real one
    # Output length when a request does not set ignore_eos: the simulated model "emits EOS"
    # after this many tokens (or at max_tokens, whichever is first).
    eos_after_tokens: int = 256
    # Streaming granularity: steps are computed on a simulated clock and delivered in
    # batches at most this far apart, so many engines fit on few cores.
    tick_s: float = 0.005
    # vLLM's --max-logprobs (default 20): the most `top_logprobs`/`logprobs` a request may ask.
    max_logprobs: int = 20
    # vLLM's --enable-auto-tool-choice (with a --tool-call-parser): without it a request
    # with tools and tool_choice "auto" gets vLLM's 400; with it the sim answers text.
    enable_auto_tool_choice: bool = False
    # vLLM's --tool-call-parser: without one, vLLM refuses forced tool calls (tool_choice
    # "required" or a named function) and --enable-auto-tool-choice does not start.
    tool_call_parser: str | None = None
    # vLLM's --runner: "auto" takes the task from the checkpoint (architecture, name);
    # "pooling" serves embeddings, "generate" completions, whatever the checkpoint says.
    runner: str = "auto"
    # vLLM's --tokenizer-mode: "deepseek_v32" renders chat in code (frontend.py), which
    # sets the API server's cost per chat request; the others all take the chat template.
    tokenizer_mode: str = "auto"
    # vLLM's --enable-lora and companions (sim/lora.py); None: LoRA off.
    lora: SimLoraConfig | None = None
    faults: FaultConfig = field(default_factory=FaultConfig)
    calibration: Calibration = DEFAULT_CALIBRATION
