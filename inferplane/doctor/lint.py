"""`lint`: fleet-level advice that is not an error (the fleet validates and plans, but
something in it costs speed, memory or requests later).

Each rule is a function over one model (and the fleet), returning `Advice` with the field,
the value, why (the pitfall) and the fix; numbers come from the estimator when the model's
config.json is local (or in the Hugging Face cache).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inferplane.gpus.spec import GpuSpec
    from inferplane.models.profile import ModelProfile
    from inferplane.spec import FleetSpec, ModelSpec

SCHEMA = "inferplane.lint/v1"
# Decode speed assumed for the longest generation when judging timeouts (P40): a slow but
# real figure for a large model under load, so the advice errs towards longer timeouts.
SLOW_DECODE_TOKENS_S = 20.0
# A smaller TP is advised only when it still holds this many sequences of max_model_len.
MIN_CONCURRENCY = 4
_VOLATILE = re.compile(
    r"(strftime_now|\bnow\(\)|datetime|current_date|today|timestamp|\{\{\s*date|uuid|"
    r"random|request_id|\d{4}-\d\d-\d\d[ T]\d\d:\d\d)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Advice:
    model: str | None
    pitfall: str
    severity: str  # "warn" | "info"
    field: str
    value: Any
    message: str
    fix: str

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "pitfall": self.pitfall, "severity": self.severity,
                "field": self.field, "value": self.value, "message": self.message,
                "fix": self.fix}

    def where(self) -> str:
        place = f"models[{self.model}].{self.field}" if self.model else self.field
        return f"{place} = {self.value!r}"

    def render(self) -> str:
        return f"{self.pitfall} {self.severity}: {self.where()}: {self.message}. Fix: {self.fix}"


@dataclass
class ModelFacts:
    """What the rules know of one model besides its spec."""

    spec: ModelSpec
    profile: ModelProfile | None
    gpu: GpuSpec | None
    version: str


def _facts(fleet: FleetSpec, model: ModelSpec) -> ModelFacts:
    from inferplane.doctor.diagnose import find_model_dir
    from inferplane.errors import InferplaneError
    from inferplane.gpus.catalog import find_gpu
    from inferplane.models import load_profile

    profile = None
    if model.source:
        directory = find_model_dir(model.source)
        if directory is not None:
            try:
                profile = load_profile(directory)
            except InferplaneError:
                profile = None
    gpu = None
    wanted = model.placement.gpu_type
    if wanted is None and fleet.gpus is not None:
        wanted = fleet.gpus.nodes[0].gpu_type
    if wanted is not None:
        gpu = find_gpu(wanted)
    return ModelFacts(model, profile, gpu, str(fleet.engine.version))


def _settings(facts: ModelFacts, **changes: Any) -> Any:
    from inferplane.estimator.types import EngineSettings

    m = facts.spec
    values: dict[str, Any] = {
        "tensor_parallel_size": m.tensor_parallel_size if isinstance(
            m.tensor_parallel_size, int) else 1,
        "gpu_memory_utilization": m.gpu_memory_utilization if isinstance(
            m.gpu_memory_utilization, float) else 0.9,
        "max_model_len": m.max_model_len if isinstance(m.max_model_len, int) else -1,
        "max_num_seqs": m.max_num_seqs,
        "dtype": m.dtype,
        "quantization": m.quantization,
        "kv_cache_dtype": m.kv_cache_dtype,
        "enforce_eager": m.enforce_eager,
        "vllm_version": facts.version,
    }
    values.update(changes)
    return EngineSettings(**values)


def _flag(model: ModelSpec, name: str) -> Any:
    for key, value in model.extra_args.items():
        if key.lstrip("-").replace("_", "-") == name:
            return value
    return None


def rule_enforce_eager(fleet: FleetSpec, f: ModelFacts) -> list[Advice]:
    m = f.spec
    if not m.enforce_eager:  # (the spec refuses it in extra_args)
        return []
    return [Advice(m.name, "P33", "warn", "enforce_eager", True,
                   "--enforce-eager turns off CUDA graphs: TTFT 85 -> 620 ms in S2",
                   "remove it; if CUDA-graph capture OOMs, capture fewer sizes "
                   "(compilation-config cudagraph_capture_sizes [1,2,4,8]) first (P05)")]


def rule_utilization_band(fleet: FleetSpec, f: ModelFacts) -> list[Advice]:
    m = f.spec
    if not isinstance(m.gpu_memory_utilization, float):
        return []
    band = 0.90
    if f.profile is not None:
        from inferplane.planner.sizing import safe_band

        band = safe_band(f.profile, _settings(f))
    if m.gpu_memory_utilization <= band:
        return []
    return [Advice(m.name, "P06", "warn", "gpu_memory_utilization", m.gpu_memory_utilization,
                   f"above the safe band for this model (<= {band:.2f}); activations and "
                   "fragmentation under load can still OOM",
                   f"use {band:.2f} or less, or `auto`")]


def rule_max_model_len(fleet: FleetSpec, f: ModelFacts) -> list[Advice]:
    m = f.spec
    if m.is_endpoint:
        return []
    if m.max_model_len == "auto":
        detail = ""
        if f.profile is not None and f.gpu is not None:
            from inferplane.estimator.memory import estimate_memory

            est = estimate_memory(f.profile, _settings(f), gpu=f.gpu)
            detail = f" (here {est.max_model_len} tokens on {f.gpu.name})"
        return [Advice(m.name, "P02", "info", "max_model_len", "auto",
                       f"auto plans the longest context that fits{detail}, which leaves the "
                       "least KV room for concurrent requests (P09)",
                       "set the P95 prompt + output length of your traffic, e.g. 8192")]
    if f.profile is not None and m.max_model_len >= f.profile.max_position_embeddings:
        return [Advice(m.name, "P02", "warn", "max_model_len", m.max_model_len,
                       f"the model's full default context ({f.profile.max_position_embeddings}"
                       " tokens): every sequence may claim that much KV cache",
                       "set the P95 prompt + output length of your traffic (S1), e.g. 8192")]
    return []


def rule_tp_larger_than_needed(fleet: FleetSpec, f: ModelFacts) -> list[Advice]:
    m = f.spec
    tp = m.tensor_parallel_size
    if not isinstance(tp, int) or tp <= 1 or f.profile is None or f.gpu is None:
        return []
    from inferplane.estimator.memory import estimate_memory
    from inferplane.estimator.rules import valid_tp_sizes

    for smaller in valid_tp_sizes(f.profile, limit=tp - 1):
        est = estimate_memory(f.profile, _settings(f, tensor_parallel_size=smaller), gpu=f.gpu)
        wanted = min(m.max_num_seqs or MIN_CONCURRENCY, MIN_CONCURRENCY)
        if est.fits and est.max_concurrency >= wanted:
            return [Advice(m.name, "P16", "warn", "tensor_parallel_size", tp,
                           f"TP {smaller} already fits on {f.gpu.name} (max_model_len "
                           f"{est.max_model_len}, concurrency {est.max_concurrency:.1f}x, by "
                           "the estimator); TP adds all-reduce traffic per token",
                           f"use tensor_parallel_size {smaller} (or auto) and spend the other "
                           "GPUs on replicas")]
    return []


def _template_text(value: Any, base: Path | None) -> str | None:
    if not isinstance(value, str):
        return None
    path = Path(value).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    if "{" not in value and path.is_file():
        return path.read_text(encoding="utf-8", errors="replace")
    return value


def rule_volatile_prefix(fleet: FleetSpec, f: ModelFacts,
                         base: Path | None = None) -> list[Advice]:
    m = f.spec
    out = []
    for name in ("chat-template", "default-chat-template-kwargs", "override-generation-config"):
        text = _template_text(_flag(m, name), base)
        hit = _VOLATILE.search(text) if text else None
        if hit is not None:
            out.append(Advice(m.name, "P45", "warn", f"extra_args.{name}", hit.group(0),
                              "a volatile value (time, date, id) in the prompt prefix makes "
                              "every request's prefix unique, so prefix caching never hits",
                              "move the volatile part to the end of the last user message, or "
                              "drop it"))
    return out


def rule_timeouts(fleet: FleetSpec, f: ModelFacts) -> list[Advice]:
    m = f.spec
    if m.task != "generate":
        return []
    if m.max_tokens_cap is not None:
        tokens = m.max_tokens_cap.limit
        what = f"max_tokens_cap {tokens}"
    elif isinstance(m.max_model_len, int):
        tokens = m.max_model_len
        what = f"max_model_len {tokens}"
    else:
        return []
    longest_s = tokens / SLOW_DECODE_TOKENS_S
    timeouts = fleet.timeouts_for(m.name)
    if timeouts.total_s >= longest_s:
        return []
    return [Advice(m.name, "P40", "warn", "timeouts.total_s", timeouts.total_s,
                   f"shorter than the longest expected generation ({what} at "
                   f"{SLOW_DECODE_TOKENS_S:.0f} tokens/s = {longest_s:.0f} s): healthy long "
                   "answers get cut",
                   f"set timeouts.total_s >= {longest_s:.0f}, or cap max_tokens "
                   "(max_tokens_cap)")]


RULES: tuple[Callable[[FleetSpec, ModelFacts], list[Advice]], ...] = (
    rule_enforce_eager, rule_utilization_band, rule_max_model_len, rule_tp_larger_than_needed,
    rule_timeouts,
)


def lint_fleet(fleet: FleetSpec, base_dir: Path | None = None) -> list[Advice]:
    """Every piece of advice for a validated fleet, model by model."""
    advice: list[Advice] = []
    for model in fleet.models:
        if model.is_endpoint:
            continue
        facts = _facts(fleet, model)
        for rule in RULES:
            advice.extend(rule(fleet, facts))
        advice.extend(rule_volatile_prefix(fleet, facts, base_dir))
    return advice
