"""vLLM's serving metrics (`vllm bench serve`) from per-request results.

Throughputs divide by the benchmark's wall duration; TPOT excludes the first token;
ITL pools every chunk gap of every request; goodput counts requests meeting every SLO
given (TTFT, TPOT, E2EL) per second. Percentiles interpolate linearly (numpy's default).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from inferplane.bench.client import RequestResult
from inferplane.errors import InferplaneError

PERCENTILES: tuple[int, ...] = (50, 90, 99)
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2el_ms", "itl_ms")


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy.percentile's default)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def distribution_ms(values_s: Sequence[float]) -> dict[str, float]:
    ms = [v * 1000.0 for v in values_s]
    out = {
        "mean": statistics.fmean(ms) if ms else 0.0,
        "median": statistics.median(ms) if ms else 0.0,
        "std": statistics.pstdev(ms) if len(ms) > 1 else 0.0,
    }
    for q in PERCENTILES:
        out[f"p{q}"] = percentile(ms, q)
    return out


def parse_slo(text: str | None) -> dict[str, float]:
    """`ttft_ms=500,tpot_ms=50` -> {"ttft_ms": 500.0, "tpot_ms": 50.0}."""
    if not text:
        return {}
    slo: dict[str, float] = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        key = key.strip()
        if not sep or key not in (*SLO_KEYS, "percentile"):
            raise InferplaneError(
                "unknown SLO", field="slo", value=part.strip(),
                fix=f"use {', '.join(SLO_KEYS)} (and percentile=) as key=value, "
                    "e.g. ttft_ms=500,tpot_ms=50",
            )
        try:
            number = float(value)
        except ValueError as exc:
            raise InferplaneError("not a number", field=f"slo.{key}", value=value,
                                  fix="e.g. ttft_ms=500") from exc
        if number <= 0 or (key == "percentile" and number > 100):
            raise InferplaneError("must be > 0 (percentile <= 100)", field=f"slo.{key}",
                                  value=number, fix="e.g. ttft_ms=500,percentile=99")
        slo[key] = number
    return slo


def meets_slo(result: RequestResult, slo: dict[str, float]) -> bool:
    if not result.success:
        return False
    if "ttft_ms" in slo and result.ttft_s * 1000 > slo["ttft_ms"]:
        return False
    if "tpot_ms" in slo and result.tpot_s * 1000 > slo["tpot_ms"]:
        return False
    if "e2el_ms" in slo and result.latency_s * 1000 > slo["e2el_ms"]:
        return False
    return not ("itl_ms" in slo and any(g * 1000 > slo["itl_ms"] for g in result.itl_s))


@dataclass(frozen=True)
class Summary:
    """The numbers of one run; `as_dict()` is the JSON schema (stable keys)."""

    completed: int
    failed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float  # req/s
    output_throughput: float  # tok/s
    total_token_throughput: float  # tok/s
    request_goodput: float | None  # req/s meeting every SLO; None without --slo
    ttft_ms: dict[str, float]
    tpot_ms: dict[str, float]
    itl_ms: dict[str, float]
    e2el_ms: dict[str, float]
    errors: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "completed": self.completed,
            "failed": self.failed,
            "duration_s": self.duration_s,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "request_throughput_req_s": self.request_throughput,
            "output_throughput_tok_s": self.output_throughput,
            "total_token_throughput_tok_s": self.total_token_throughput,
            "request_goodput_req_s": self.request_goodput,
            "ttft_ms": self.ttft_ms,
            "tpot_ms": self.tpot_ms,
            "itl_ms": self.itl_ms,
            "e2el_ms": self.e2el_ms,
            "errors": list(self.errors),
        }


def summarize(
    results: Sequence[RequestResult], duration_s: float, slo: dict[str, float] | None = None
) -> Summary:
    ok = [r for r in results if r.success]
    failed = [r for r in results if not r.success]
    duration = max(duration_s, 1e-9)
    inputs = sum(r.prompt_tokens for r in ok)
    outputs = sum(r.output_tokens for r in ok)
    limits = {k: v for k, v in (slo or {}).items() if k in SLO_KEYS}
    goodput = (
        sum(1 for r in ok if meets_slo(r, limits)) / duration if limits else None
    )
    errors = sorted({r.error for r in failed})[:5]
    return Summary(
        completed=len(ok),
        failed=len(failed),
        duration_s=duration_s,
        total_input_tokens=inputs,
        total_output_tokens=outputs,
        request_throughput=len(ok) / duration,
        output_throughput=outputs / duration,
        total_token_throughput=(inputs + outputs) / duration,
        request_goodput=goodput,
        ttft_ms=distribution_ms([r.ttft_s for r in ok]),
        tpot_ms=distribution_ms([r.tpot_s for r in ok if r.output_tokens > 1]),
        itl_ms=distribution_ms([g for r in ok for g in r.itl_s]),
        e2el_ms=distribution_ms([r.latency_s for r in ok]),
        errors=tuple(errors),
    )
