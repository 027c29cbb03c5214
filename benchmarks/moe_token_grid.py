"""Grid over the per-decode-token fused-MoE cost (`Calibration.moe_decode_token_rate`) of
one expert format, fitted together with that format's expert factor, on the fit split of
the published runs (docs/simulator.md, round 7). Each setting replays only the runs whose
experts are in that format (the term touches nothing else) and merges them with the
shipped constants' rows of every other fit run, so the medians printed are the whole fit
split's, exactly.

  .venv/bin/python benchmarks/moe_token_grid.py FORMAT --rates 10,30 --factors 1,2.5
      [--generations hopper,ampere] [--base FORMAT=RATE:FACTOR[@GEN+GEN] ...]

FORMAT is "bf16", "fp8" or "mxfp4"; each (rate, factor) sets the rate for FORMAT on every
generation of --generations and multiplies that format's expert factor (bf16:
moe_kernel_efficiency, else moe_format_efficiency[FORMAT]) by the factor. `--base` applies
settings of other formats first (their runs are replayed with them too). Never replays a
held-out run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import published_fidelity as pf

from inferplane.sim.timing import GENERATION_CALIBRATION, Calibration


def with_term(cal: Calibration, fmt: str, rate: float, factor: float) -> Calibration:
    """`cal` with FORMAT's per-token rate set and its expert factor x `factor`."""
    rates = dict(cal.moe_decode_token_rate) | {fmt: rate}
    cal = replace(cal, moe_decode_token_rate=tuple(sorted(rates.items())))
    if fmt == "bf16":
        return replace(cal, moe_kernel_efficiency=cal.moe_kernel_efficiency * factor)
    formats = dict(cal.moe_format_efficiency)
    formats[fmt] = formats.get(fmt, cal.format_factor(fmt)) * factor
    return replace(cal, moe_format_efficiency=tuple(sorted(formats.items())))


def medians(rows: list[pf.Row]) -> tuple[float, ...]:
    return tuple(
        statistics.median(abs(r.error(m)) for r in rows if m in r.metrics) for m in pf.METRICS
    )


def summary(rows: list[pf.Row]) -> str:
    moe = [r for r in rows if pf.family(r.point) == "moe"]
    dense = [r for r in rows if pf.family(r.point) == "dense"]
    share = [r.error("throughput") for r in moe if pf.regime(r.point) == pf.REGIMES[1]]
    a, m, d = medians(rows), medians(moe), medians(dense)
    return (
        "all "
        + "/".join(f"{v:.1f}" for v in a)
        + f" (mean {statistics.fmean(a):.2f})"
        + "  MoE "
        + "/".join(f"{v:.1f}" for v in m)
        + f" (mean {statistics.fmean(m):.2f})"
        + "  dense "
        + "/".join(f"{v:.1f}" for v in d)
        + f"  MoE ShareGPT thr {statistics.median(share):+.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("format", choices=("bf16", "fp8", "mxfp4"))
    parser.add_argument("--rates", default="10,20,30,50")
    parser.add_argument("--factors", default="1.5,2,2.5,3")
    parser.add_argument(
        "--base",
        action="append",
        default=[],
        help="FORMAT=RATE:FACTOR[@GEN+GEN] applied first (all generations)",
    )
    parser.add_argument(
        "--generations",
        default="hopper,ampere",
        help="generations the setting applies to (others keep theirs)",
    )
    parser.add_argument("--per-run", action="store_true", help="print this format's rows")
    args = parser.parse_args()
    points = [p for p in pf.load_points() if p["split"] == "fit"]
    base = dict(GENERATION_CALIBRATION)
    for item in args.base:
        fmt, setting = item.split("=")
        setting, _, where = setting.partition("@")
        rate, factor = (float(v) for v in setting.split(":"))
        on = set(where.split("+")) if where else set(base)
        base = {g: with_term(c, fmt, rate, factor) if g in on else c for g, c in base.items()}

    def experts_in(p: dict[str, object], fmts: set[str]) -> bool:
        return pf.family(p) == "moe" and pf.weight_format(p) in fmts

    rows = [r for r in pf.replay_all(points, base) if isinstance(r, pf.Row)]
    print(f"base: {summary(rows)}", flush=True)
    gens = set(args.generations.split(","))

    def varied(p: dict[str, object]) -> bool:
        return experts_in(p, {args.format}) and pf.gpu_generation(p) in gens

    mine = [p for p in points if varied(p)]
    others = [r for r in rows if not varied(r.point)]
    print(f"{args.format} on {sorted(gens)}: {len(mine)} fit runs", flush=True)
    for rate in (float(v) for v in args.rates.split(",")):
        for factor in (float(v) for v in args.factors.split(",")):
            cals = {
                g: with_term(c, args.format, rate, factor) if g in gens else c
                for g, c in base.items()
            }
            new = [r for r in pf.replay_all(mine, cals) if isinstance(r, pf.Row)]
            print(f"rate {rate:g} factor {factor:g}: {summary(others + new)}", flush=True)
            if args.per_run:
                for r in new:
                    cells = " ".join(f"{m} {r.error(m):+.1f}" for m in r.metrics)
                    print(f"    {r.point['id']}: {cells}")


if __name__ == "__main__":
    main()
