"""Cost per million tokens and the self-host vs API break-even (S2's decision).

    $/1M tokens = fleet $/hour / (tokens/s x 3600) x 1e6
    break-even daily volume = fleet $/day / API $ per token

A fleet is paid for every hour whether busy or not, so the break-even is the daily token
volume above which renting the GPUs around the clock costs less than the API; below it the
API is cheaper. Cost per token assumes the fleet runs at the throughput measured (bench)
or simulated at peak (capacity): at lower load each token costs more.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferplane.errors import InferplaneError

PRICES_FILE = Path(__file__).with_name("prices.yaml")
HOURS_PER_DAY = 24.0


@dataclass(frozen=True)
class GpuPrice:
    gpu: str  # catalog name
    usd_per_gpu_hour: float
    source: str
    as_of: str = ""


@dataclass(frozen=True)
class ApiPrice:
    """An API's list price, USD per 1M tokens: one price for every token, or split."""

    input_usd_per_m: float
    output_usd_per_m: float

    def usd_for(self, input_tokens: float, output_tokens: float) -> float:
        return (input_tokens * self.input_usd_per_m + output_tokens * self.output_usd_per_m) / 1e6


def _catalog_name(name: str, where: str) -> str:
    from inferplane.gpus import find_gpu

    spec = find_gpu(name)
    if spec is None:
        raise InferplaneError("unknown GPU type", field=where, value=name,
                              fix="use a name `inferplane gpus` lists, e.g. H100 or L40S")
    return spec.name


def _read_prices(path: Path) -> dict[str, GpuPrice]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise InferplaneError(f"cannot read prices: {exc}", location=str(path)) from exc
    rows = data.get("prices") if isinstance(data, dict) else None
    if not isinstance(rows, dict):
        raise InferplaneError("needs a mapping under 'prices'", location=str(path),
                              fix="prices:\n  H100: {usd_per_gpu_hour: 2.5, source: my quote}")
    out: dict[str, GpuPrice] = {}
    for name, row in rows.items():
        where = f"{path}: prices.{name}"
        value = row.get("usd_per_gpu_hour") if isinstance(row, dict) else row
        if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
            raise InferplaneError("needs usd_per_gpu_hour > 0", location=where, value=value,
                                  fix=f"{name}: {{usd_per_gpu_hour: 2.5, source: ...}}")
        source = str(row.get("source", path)) if isinstance(row, dict) else str(path)
        as_of = str(row.get("as_of", "")) if isinstance(row, dict) else ""
        gpu = _catalog_name(str(name), where)
        out[gpu] = GpuPrice(gpu, float(value), source, as_of)
    return out


def parse_price_overrides(text: str | None) -> dict[str, float]:
    """`H100=2.1,L40S=0.9` -> {catalog name: USD per GPU-hour}."""
    out: dict[str, float] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        name, sep, value = part.partition("=")
        try:
            price = float(value)
        except ValueError:
            price = -1.0
        if not sep or price <= 0:
            raise InferplaneError("expected GPU=USD per GPU-hour", field="price",
                                  value=part.strip(), fix="e.g. --price H100=2.1,L40S=0.9")
        out[_catalog_name(name.strip(), "price")] = price
    return out


def load_prices(
    path: Path | None = None, overrides: dict[str, float] | None = None
) -> dict[str, GpuPrice]:
    """The shipped list, then `path`'s entries, then `overrides` (each wins over the last)."""
    prices = _read_prices(PRICES_FILE)
    if path is not None:
        prices.update(_read_prices(path))
    for gpu, usd in (overrides or {}).items():
        prices[gpu] = GpuPrice(gpu, usd, "--price")
    return prices


def parse_api_price(text: str | None) -> ApiPrice | None:
    """`0.6` (every token) or `in=0.15,out=0.6`, USD per 1M tokens."""
    if text is None or not text.strip():
        return None
    try:
        if "=" not in text:
            value = float(text)
            if value <= 0:
                raise ValueError
            return ApiPrice(value, value)
        parts = dict(p.strip().split("=", 1) for p in text.split(","))
        unknown = set(parts) - {"in", "out"}
        if unknown:
            raise ValueError
        price = ApiPrice(float(parts.get("in", 0)), float(parts.get("out", 0)))
        if price.input_usd_per_m < 0 or price.output_usd_per_m <= 0:
            raise ValueError
        return price
    except ValueError:
        raise InferplaneError(
            "expected USD per 1M tokens", field="api_price", value=text,
            fix="e.g. --api-price 0.6, or --api-price in=0.15,out=0.6",
        ) from None


def per_million(usd_per_hour: float, tokens_per_s: float) -> float | None:
    if tokens_per_s <= 0:
        return None
    return usd_per_hour / (tokens_per_s * 3600.0) * 1e6


def cost_report(
    usd_per_hour: float,
    input_tok_s: float,
    output_tok_s: float,
    api: ApiPrice | None = None,
) -> dict[str, Any]:
    """$/1M output and total tokens at this throughput; against an API, the break-even."""
    out: dict[str, Any] = {
        "usd_per_hour": usd_per_hour,
        "usd_per_day": usd_per_hour * HOURS_PER_DAY,
        "usd_per_m_output_tokens": per_million(usd_per_hour, output_tok_s),
        "usd_per_m_total_tokens": per_million(usd_per_hour, input_tok_s + output_tok_s),
    }
    if api is None or output_tok_s <= 0:
        return out
    # The API's price for this traffic mix, per output token (inputs ride along).
    mix = input_tok_s / output_tok_s
    api_per_output = api.usd_for(mix, 1.0)
    daily = usd_per_hour * HOURS_PER_DAY
    breakeven_output = daily / api_per_output
    capacity_output = output_tok_s * 3600.0 * HOURS_PER_DAY
    out.update({
        "api_usd_per_m_input_tokens": api.input_usd_per_m,
        "api_usd_per_m_output_tokens": api.output_usd_per_m,
        "api_usd_per_m_output_tokens_with_inputs": api_per_output * 1e6,
        "breakeven_output_tokens_per_day": breakeven_output,
        "breakeven_total_tokens_per_day": breakeven_output * (1 + mix),
        "fleet_output_tokens_per_day_at_this_rate": capacity_output,
        "self_host_cheaper_at_full_load": capacity_output > breakeven_output,
    })
    return out


def describe(report: dict[str, Any]) -> list[str]:
    """The cost lines a table prints."""
    lines = [f"fleet ${report['usd_per_hour']:.2f}/h = ${report['usd_per_day']:.0f}/day"
             + (f" ({report['gpus_counted']})" if report.get("gpus_counted") else "")]
    if report.get("usd_per_m_output_tokens") is not None:
        lines.append(f"${report['usd_per_m_output_tokens']:.3f} per 1M output tokens, "
                     f"${report['usd_per_m_total_tokens']:.3f} per 1M total tokens")
    if "breakeven_output_tokens_per_day" in report:
        be = report["breakeven_output_tokens_per_day"]
        cap = report["fleet_output_tokens_per_day_at_this_rate"]
        verdict = ("self-hosting is cheaper above it" if report["self_host_cheaper_at_full_load"]
                   else "the fleet cannot reach it at this throughput: the API is cheaper")
        lines.append(f"break-even vs API: {be / 1e6:,.1f}M output tokens/day "
                     f"(fleet serves up to {cap / 1e6:,.1f}M/day); {verdict}")
    return lines
