"""`inferplane capacity FLEET.yaml --traffic TRAFFIC.yaml`: the cheapest GPUs, TP,
replicas and max_num_seqs per model that meet the SLO at peak (simulated clock)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import typer

from inferplane.cli.main import app
from inferplane.cli.tables import Col, fitted_table
from inferplane.errors import InferplaneError

if TYPE_CHECKING:
    from inferplane.bench.capacity import CapacityAnswer
    from inferplane.bench.cost import ApiPrice

DEFAULT_GPUS = "H100,L40S,A100-80GB"


def _verify(fragment: dict[str, Any]) -> str:
    """Plan the fragment as `inferplane plan` would; the verdict in one line."""
    import yaml

    from inferplane.planner.build import plan_fleet
    from inferplane.spec.loader import parse_fleet

    try:
        fleet = parse_fleet(yaml.safe_dump(fragment, sort_keys=False), filename="fragment")
        # capacity planning: the fewest GPUs that hold the fragment (GPUs to rent)
        plan = plan_fleet(fleet, time_limit_s=1.0, check_fixes=False, objective="min_gpus")
    except InferplaneError as exc:
        return f"plan refuses it: {exc.render()}"
    return f"inferplane plan accepts it: {plan.totals.gpus_used} GPU(s) used"


@app.command()
def capacity(
    fleet_file: Path = typer.Argument(..., help="Fleet file (YAML).", show_default=False),
    traffic: Path = typer.Option(..., "--traffic", help="Traffic file (YAML), per model.",
                                 show_default=False),
    slo: str | None = typer.Option(
        None, "--slo", help="Targets at the peak, e.g. ttft_ms=2000,tpot_ms=50,percentile=99 "
        "(default: the traffic file's slo:)."),
    gpus: str = typer.Option(DEFAULT_GPUS, "--gpus", help="GPU types to consider."),
    prices: Path | None = typer.Option(None, "--prices", help="Price list (YAML) over the "
                                       "shipped one."),
    price: str | None = typer.Option(None, "--price", help="Overrides, e.g. H100=2.1,L40S=0.9 "
                                     "(USD per GPU-hour)."),
    api_price: str | None = typer.Option(
        None, "--api-price", help="API price, USD per 1M tokens: 0.6 or in=0.15,out=0.6."),
    requests: int = typer.Option(160, "--requests", help="Simulated requests per "
                                 "configuration (the first 20% warm up)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the simulated arrivals."),
    out: Path | None = typer.Option(None, "--out", help="Write the fleet fragment here."),
    verify: bool = typer.Option(True, "--verify/--no-verify",
                                help="Plan the fragment to check the planner takes it."),
    as_json: bool = typer.Option(False, "--json", help="Print the answer as JSON."),
) -> None:
    """Size each model of the traffic on the simulator's clock: the cheapest (GPU type,
    TP, replicas, max_num_seqs) meeting the SLO at peak, its binding constraint, the cost,
    and a fleet fragment `inferplane plan` takes."""
    import yaml

    from inferplane.bench.capacity import answer_dict, fleet_fragment, plan_capacity
    from inferplane.bench.cost import load_prices, parse_api_price, parse_price_overrides
    from inferplane.bench.metrics import parse_slo
    from inferplane.bench.traffic import load_traffic
    from inferplane.spec import load_fleet

    fleet = load_fleet(fleet_file)
    load = load_traffic(traffic)
    targets = {**load.slo, **parse_slo(slo)}
    price_list = load_prices(prices, parse_price_overrides(price))
    api = parse_api_price(api_price)
    gpu_list = [g.strip() for g in gpus.split(",") if g.strip()]
    if not gpu_list:
        raise InferplaneError("no GPU types", field="--gpus", value=gpus, fix="e.g. H100,L40S")
    answer = plan_capacity(fleet, load, gpus=gpu_list, prices=price_list, slo=targets,
                           requests=requests, seed=seed)
    raw = yaml.safe_load(fleet_file.read_text(encoding="utf-8")) or {}
    fragment = fleet_fragment(fleet, raw, answer)
    fragment_text = yaml.safe_dump(fragment, sort_keys=False)
    if out is not None:
        out.write_text(fragment_text, encoding="utf-8")
    verdict = _verify(fragment) if verify and fragment["models"] else ""
    if as_json:
        data = answer_dict(answer, api)
        data["fleet_fragment"] = fragment
        data["plan_check"] = verdict
        typer.echo(json.dumps(data, indent=2))
        return
    _print(answer, api, fragment_text, verdict)


def _columns(pct: str) -> tuple[Col, ...]:
    """The answer (GPU, TP, replicas, GPUs, $/h) is never hidden at 80 columns."""
    right: Literal["right"] = "right"
    return (
        Col("model"), Col("peak", drop=3, justify=right), Col("GPU"),
        Col("TP", justify=right), Col("replicas", "repl", justify=right),
        Col("max_num_seqs", "seqs", drop=4, justify=right), Col("GPUs", justify=right),
        Col("$/h", justify=right), Col(f"{pct} TTFT", "TTFT", drop=2, justify=right),
        Col(f"{pct} TPOT", "TPOT", drop=5, justify=right), Col("binding", drop=1, wrap=True),
    )


def _print(answer: CapacityAnswer, api: ApiPrice | None, fragment: str, verdict: str) -> None:
    from rich.console import Console

    from inferplane.bench.capacity import DEFAULT_PERCENTILE, model_cost
    from inferplane.bench.cost import describe

    console = Console(highlight=False)
    pct = f"p{answer.slo.get('percentile', DEFAULT_PERCENTILE):g}"
    goals = ", ".join(f"{k.removesuffix('_ms').upper()} <= {v:g} ms"
                      for k, v in answer.slo.items() if k != "percentile")
    rows = []
    for m in answer.models:
        if m.best is None:
            rows.append([m.model, f"{m.traffic.peak_rps:g} rps", "-", "-", "-", "-", "-", "-",
                         "-", "-", f"{m.binding}: {m.detail}"])
            continue
        c = m.best.candidate
        rows.append([
            m.model, f"{m.traffic.peak_rps:g} rps", c.gpu_type, str(c.tensor_parallel_size),
            str(m.best.replicas), str(c.max_num_seqs), str(m.gpus), f"{m.usd_per_hour:.2f}",
            f"{m.best.p_ttft_ms:.0f} ms", f"{m.best.p_tpot_ms:.1f} ms", m.binding,
        ])
    table = fitted_table(_columns(pct), rows, console.width,
                         f"cheapest configuration meeting {pct} {goals} at peak")
    console.print(table)
    gpus = sum(m.gpus for m in answer.models)
    console.print(f"total: {gpus} GPU(s), ${answer.usd_per_hour:.2f}/h "
                  f"(${answer.usd_per_hour * 24:,.0f}/day); {answer.evaluated} configurations "
                  f"simulated in {answer.elapsed_s:.1f} s")
    for note in answer.notes:
        console.print(f"note: {note}")
    for m in answer.models:
        console.print(f"[bold]{m.model}[/]: {m.binding} - {m.detail}")
        report = model_cost(m, api)
        if report is None:
            continue
        for line in describe(report):
            console.print(f"  {line}")
        if "breakeven_requests_per_day" in report:
            console.print(f"  break-even = {report['breakeven_requests_per_day']:,.0f} "
                          f"requests/day of this mix; the API would cost "
                          f"${report['api_usd_per_day']:,.0f}/day for the traffic's day")
        over_day = report.get("usd_per_m_output_tokens_over_the_day")
        if over_day is not None and not m.traffic.flat_day:
            console.print(f"  ${over_day:.3f} per 1M output tokens over the daily profile "
                          f"({report['daily_output_tokens'] / 1e6:,.1f}M output tokens/day)")
    if verdict:
        console.print(f"fleet fragment ({verdict}):")
    else:
        console.print("fleet fragment:")
    console.print(fragment, markup=False)
