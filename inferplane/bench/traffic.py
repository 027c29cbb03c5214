"""The traffic file of `inferplane capacity`: per model, the load to size for.

    slo: {ttft_ms: 2000, tpot_ms: 50, percentile: 99}   # optional; --slo wins
    models:
      qwen3-8b:
        peak_rps: 20               # or daily_rps: [24 hourly averages]; peak = their max
        input_tokens: 1500         # or {mean: 1500, range: 0.5} (uniform +-50%)
        output_tokens: 300         # same forms
        prefix_share: 0.6          # share of each prompt that is a shared prefix (P45)
        num_prefixes: 4            # how many distinct shared prefixes
        api: chat                  # or completions (the default, as `inferplane bench`):
                                   # what the API server spends per request first
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferplane.bench.metrics import parse_slo
from inferplane.bench.simclock import Arrival
from inferplane.errors import InferplaneError

APIS = ("completions", "chat")
_MODEL_KEYS = {"api", "peak_rps", "daily_rps", "input_tokens", "output_tokens", "prefix_share",
               "num_prefixes"}


@dataclass(frozen=True)
class Lengths:
    mean: int
    range_ratio: float = 0.0

    def draw(self, rng: random.Random) -> int:
        if self.range_ratio == 0:
            return self.mean
        low = max(1, round(self.mean * (1 - self.range_ratio)))
        return rng.randint(low, max(low, round(self.mean * (1 + self.range_ratio))))


@dataclass(frozen=True)
class ModelTraffic:
    model: str
    peak_rps: float
    daily_requests: float  # from daily_rps, else the peak all day
    input_tokens: Lengths
    output_tokens: Lengths
    prefix_share: float = 0.0
    num_prefixes: int = 1
    flat_day: bool = True  # no daily profile given: the peak all day
    api: str = "completions"  # the endpoint clients call (sim.frontend.api_server_work_s)

    def arrivals(self, rate: float, count: int, seed: int = 0) -> list[Arrival]:
        """`count` Poisson arrivals at `rate` req/s, lengths and shared prefixes drawn with
        `seed` (the same draws at every rate: only the gaps scale)."""
        rng = random.Random(seed)
        longest = round(self.input_tokens.mean * (1 + self.input_tokens.range_ratio)) + 1
        prefix_ids = [[(p * 7_000_003 + i * 104_729) % 60_000 + 1 for i in range(longest)]
                      for p in range(self.num_prefixes)] if self.prefix_share > 0 else []
        out, t = [], 0.0
        for n in range(count):
            n_in = self.input_tokens.draw(rng)
            n_out = self.output_tokens.draw(rng)
            shared = min(n_in - 1, int(n_in * self.prefix_share)) if prefix_ids else 0
            prompt = prefix_ids[rng.randrange(self.num_prefixes)][:shared] if shared else []
            prompt = prompt + [(n * 1_000_003 + i * 7_919) % 50_000 + 60_001
                               for i in range(n_in - shared)]
            out.append(Arrival(t, prompt, n_out))
            t += rng.expovariate(1.0) / rate
        return out


@dataclass(frozen=True)
class Traffic:
    models: dict[str, ModelTraffic]
    slo: dict[str, float]


def _lengths(value: Any, where: str) -> Lengths:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return Lengths(value)
    if isinstance(value, dict) and set(value) <= {"mean", "range"}:
        mean, spread = value.get("mean"), value.get("range", 0.0)
        if (isinstance(mean, int) and mean >= 1 and isinstance(spread, int | float)
                and 0 <= spread < 1):
            return Lengths(mean, float(spread))
    raise InferplaneError("expected tokens >= 1, or {mean: N, range: 0..1}", location=where,
                          value=str(value), fix="e.g. 1500 or {mean: 1500, range: 0.5}")


def _number(value: Any, where: str, *, low: float, high: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < low or (
        high is not None and value > high
    ):
        bound = f">= {low}" + (f" and <= {high}" if high is not None else "")
        raise InferplaneError(f"must be a number {bound}", location=where, value=str(value))
    return float(value)


def parse_traffic(data: Any, where: str) -> Traffic:
    if not isinstance(data, dict) or not isinstance(data.get("models"), dict):
        raise InferplaneError("needs a mapping under 'models'", location=where,
                              fix="models:\n  my-model: {peak_rps: 10, input_tokens: 1000, "
                                  "output_tokens: 200}")
    unknown = set(data) - {"models", "slo"}
    if unknown:
        raise InferplaneError(f"unknown keys {sorted(unknown)}", location=where,
                              fix="use models: and slo:")
    slo_raw = data.get("slo") or {}
    if not isinstance(slo_raw, dict):
        raise InferplaneError("slo must be a mapping", location=f"{where}: slo",
                              fix="slo: {ttft_ms: 2000, tpot_ms: 50}")
    slo = parse_slo(",".join(f"{k}={v}" for k, v in slo_raw.items()))
    models: dict[str, ModelTraffic] = {}
    for name, row in data["models"].items():
        at = f"{where}: models.{name}"
        if not isinstance(row, dict):
            raise InferplaneError("expected a mapping", location=at)
        bad = set(row) - _MODEL_KEYS
        if bad:
            raise InferplaneError(f"unknown keys {sorted(bad)}", location=at,
                                  fix=f"use {sorted(_MODEL_KEYS)}")
        for key in ("input_tokens", "output_tokens"):
            if key not in row:
                raise InferplaneError(f"missing {key}", location=at, fix=f"{key}: 1000")
        daily = row.get("daily_rps")
        if daily is not None:
            if (not isinstance(daily, list) or len(daily) != 24
                    or any(isinstance(v, bool) or not isinstance(v, int | float) or v < 0
                           for v in daily) or max(daily) <= 0):
                raise InferplaneError("daily_rps needs 24 hourly averages >= 0, not all 0",
                                      location=f"{at}.daily_rps")
            peak = float(max(daily))
            per_day = float(sum(daily)) * 3600.0
        elif "peak_rps" in row:
            peak = _number(row["peak_rps"], f"{at}.peak_rps", low=1e-6)
            per_day = peak * 86400.0
        else:
            raise InferplaneError("needs peak_rps or daily_rps", location=at,
                                  fix="peak_rps: 10")
        models[str(name)] = ModelTraffic(
            model=str(name), peak_rps=peak, daily_requests=per_day,
            input_tokens=_lengths(row["input_tokens"], f"{at}.input_tokens"),
            output_tokens=_lengths(row["output_tokens"], f"{at}.output_tokens"),
            prefix_share=_number(row.get("prefix_share", 0.0), f"{at}.prefix_share",
                                 low=0.0, high=0.99),
            num_prefixes=int(_number(row.get("num_prefixes", 1), f"{at}.num_prefixes",
                                     low=1)),
            flat_day=daily is None,
            api=_api(row.get("api", "completions"), f"{at}.api"),
        )
    return Traffic(models, slo)


def _api(value: Any, where: str) -> str:
    if value not in APIS:
        raise InferplaneError("unknown API", location=where, value=str(value),
                              fix="api: completions or api: chat")
    return str(value)


def load_traffic(path: Path) -> Traffic:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise InferplaneError(f"cannot read traffic file: {exc}", location=str(path)) from exc
    return parse_traffic(data, str(path))
