"""`inferplane bench TARGET`: load-test a gateway or engine URL, or a fleet file brought up
on the simulator, with vLLM's metric definitions."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from inferplane.cli.main import app
from inferplane.errors import InferplaneError

if TYPE_CHECKING:
    from inferplane.bench.datasets import BenchRequest, Dataset
    from inferplane.bench.load import RunResult, Sweep

DEFAULT_SWEEP = "1,2,4,8,16,32,64,128"


def _levels(text: str) -> list[int]:
    try:
        levels = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1 or levels != sorted(set(levels)):
        raise InferplaneError("expected increasing concurrencies >= 1", field="--sweep",
                              value=text, fix=f"e.g. --sweep {DEFAULT_SWEEP}")
    return levels


def _mix(text: str | None) -> list[tuple[str, float]]:
    if not text:
        return []
    out = []
    for part in text.split(","):
        name, sep, weight = part.partition("=")
        try:
            out.append((name.strip(), float(weight) if sep else 1.0))
        except ValueError:
            raise InferplaneError("expected model=weight", field="--mix", value=part,
                                  fix="e.g. --mix chat=3,code=1") from None
    return out


@contextmanager
def _target(target: str) -> Iterator[tuple[str, list[str], list[str], Any, list[str]]]:
    """(base URL, models it serves, engine URLs to scrape, plan or None, notes on the
    simulator's measured timing error for a fleet run on it)."""
    if target.startswith(("http://", "https://")):
        yield target.rstrip("/"), [], [target.rstrip("/")], None, []
        return
    path = Path(target)
    if not path.is_file():
        raise InferplaneError("not a URL nor a fleet file", field="TARGET", value=target,
                              fix="http://host:port, or a fleet file to run on the simulator")
    from inferplane.bench.target import FleetOnSim, timing_band_lines

    with FleetOnSim(path) as sim:
        yield sim.url, sim.models, sim.engine_urls, sim.plan, timing_band_lines(sim.replicas)


async def _served_models(url: str) -> list[str]:
    import aiohttp

    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
            session.get(url + "/v1/models") as response,
        ):
            body = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise InferplaneError(f"cannot list models at {url}: {exc}", field="TARGET",
                              fix="is the server up? or pass --model") from exc
    return [str(m.get("id")) for m in body.get("data") or [] if isinstance(m, dict)]


def _dataset(kind: str, num: int, input_len: int, output_len: int, range_ratio: float,
             dataset_path: Path | None, prefix_len: int, num_prefixes: int,
             tokenizer: Path | None, time_scale: float, seed: int) -> Dataset:
    from inferplane.bench import datasets as ds

    tok = ds.HfTextTokenizer(tokenizer) if tokenizer is not None else None
    vocab = tok.vocab_size if tok is not None else 0
    if kind == "random":
        return ds.random_dataset(num, input_len, output_len, range_ratio=range_ratio,
                                 seed=seed, tokenizer=tok, vocab_size=vocab)
    if kind == "prefix":
        return ds.prefix_dataset(num, prefix_len, input_len, output_len,
                                 num_prefixes=num_prefixes, seed=seed, tokenizer=tok,
                                 vocab_size=vocab)
    if kind in ("sharegpt", "trace") and dataset_path is None:
        raise InferplaneError("needs --dataset-path", field="--dataset", value=kind,
                              fix=f"--dataset {kind} --dataset-path FILE")
    assert dataset_path is not None
    if kind == "sharegpt":
        return ds.sharegpt_dataset(dataset_path, num, seed=seed, tokenizer=tok)
    if kind == "trace":
        return ds.trace_dataset(dataset_path, num_requests=num, time_scale=time_scale,
                                tokenizer=tok, vocab_size=vocab)
    raise InferplaneError("unknown dataset", field="--dataset", value=kind,
                          fix="random, sharegpt, prefix or trace")


def _fleet_tokenizer(target: str, model: str | None) -> Path | None:
    """A fleet file's model directory with a tokenizer.json: count with the real thing."""
    path = Path(target)
    if target.startswith(("http://", "https://")) or not path.is_file():
        return None
    from inferplane.spec import load_fleet

    fleet = load_fleet(path)
    placed = [m for m in fleet.placed_models if m.task != "embed"]
    chosen = next((m for m in placed if m.name == model), placed[0] if placed else None)
    if chosen is None or chosen.source is None:
        return None
    candidate = Path(chosen.source) / "tokenizer.json"
    return candidate if candidate.is_file() else None


def _target_cost(plan: Any, models: list[str], gpu_hour_usd: float | None,
                 gpus: int | None, prices: str | None) -> Any:
    from inferplane.bench.cost import load_prices, parse_price_overrides
    from inferplane.bench.gpu_cost import target_cost

    if gpus is not None and gpus < 1:
        raise InferplaneError("must be >= 1", field="--gpus", value=gpus,
                              fix="the number of GPUs behind the target, e.g. --gpus 8")
    if gpus is not None and plan is not None:
        raise InferplaneError("a fleet file's plan already says which GPUs serve the model",
                              field="--gpus", value=gpus, fix="leave --gpus out for a fleet file")
    return target_cost(plan, models, gpu_hour_usd, gpus,
                       load_prices(None, parse_price_overrides(prices)))


@app.command()
def bench(
    target: str = typer.Argument(..., help="http://host:port (gateway or engine), or a fleet "
                                 "file to run on the simulator.", show_default=False),
    model: str | None = typer.Option(None, "--model", help="Model to send (default: the "
                                     "first the target serves)."),
    mix: str | None = typer.Option(None, "--mix", help="Per-model mix, e.g. chat=3,code=1."),
    api: str = typer.Option("completions", "--api", help="completions or chat."),
    dataset: str = typer.Option("random", "--dataset",
                                help="random, sharegpt, prefix or trace."),
    dataset_path: Path | None = typer.Option(None, "--dataset-path",
                                             help="ShareGPT JSON or JSONL trace."),
    num_requests: int = typer.Option(100, "--num-requests", help="Requests per run."),
    input_len: int = typer.Option(512, "--input-len", help="Prompt tokens (prefix: suffix)."),
    output_len: int = typer.Option(128, "--output-len", help="Output tokens."),
    range_ratio: float = typer.Option(0.0, "--range-ratio",
                                      help="Lengths uniform in len x (1 +- ratio)."),
    prefix_len: int = typer.Option(256, "--prefix-len", help="Shared prefix tokens."),
    num_prefixes: int = typer.Option(1, "--num-prefixes", help="Distinct shared prefixes."),
    tokenizer: Path | None = typer.Option(None, "--tokenizer",
                                          help="tokenizer.json (or its directory)."),
    time_scale: float = typer.Option(1.0, "--time-scale", help="Trace: < 1 replays faster."),
    concurrency: int | None = typer.Option(None, "--concurrency",
                                           help="Clients (or a cap with --rate)."),
    rate: float | None = typer.Option(None, "--rate", help="Open-loop arrivals, req/s."),
    burstiness: float = typer.Option(1.0, "--burstiness",
                                     help="Gamma shape of arrivals; 1 = Poisson."),
    sweep: str | None = typer.Option(None, "--sweep", help="Concurrency levels to sweep until "
                                     f"saturated, e.g. {DEFAULT_SWEEP}."),
    slo: str | None = typer.Option(None, "--slo", help="Goodput targets, e.g. "
                                   "ttft_ms=500,tpot_ms=50."),
    max_duration_s: float = typer.Option(600.0, "--max-duration-s",
                                         help="Cap on each run's wall time."),
    gpu_hour_usd: float | None = typer.Option(None, "--gpu-hour-usd", help="Price of one GPU "
                                              "per hour, USD (fleet files: prices.yaml)."),
    gpus: int | None = typer.Option(None, "--gpus", help="URL targets: the GPUs behind the "
                                    "model, charged at --gpu-hour-usd each (default 1)."),
    price: str | None = typer.Option(None, "--price", help="Price overrides, H100=2.1,..."),
    api_price: str | None = typer.Option(None, "--api-price",
                                         help="API price per 1M tokens: 0.6 or in=..,out=.."),
    seed: int = typer.Option(0, "--seed", help="Dataset and arrival seed."),
    warmup: int = typer.Option(1, "--warmup", help="Uncounted requests sent first."),
    out: Path | None = typer.Option(
        None, "--out", help="Directory for bench.json, CSVs and PNG plots (plots: matplotlib)."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Load-test TARGET: TTFT, TPOT, ITL, E2EL (p50/p90/p99), throughputs and goodput as
    `vllm bench serve` defines them, with the server's /metrics before and after."""
    from inferplane.bench.cost import cost_report, parse_api_price
    from inferplane.bench.datasets import assign_models, level_seed
    from inferplane.bench.load import LoadSpec
    from inferplane.bench.metrics import parse_slo
    from inferplane.bench.results import write_results

    if api not in ("completions", "chat"):
        raise InferplaneError("unknown API", field="--api", value=api, fix="completions or chat")
    targets = parse_slo(slo)
    api_cost = parse_api_price(api_price)
    levels = _levels(sweep) if sweep else None
    if rate is not None:
        load = LoadSpec("poisson" if burstiness == 1.0 else "gamma", concurrency=concurrency,
                        rate=rate, burstiness=burstiness, seed=seed)
    elif dataset == "trace":
        load = LoadSpec("trace", concurrency=concurrency, seed=seed)
    else:
        load = LoadSpec("concurrency", concurrency=concurrency or 8, seed=seed)
    if levels is None:
        load.check()

    if tokenizer is None:
        tokenizer = _fleet_tokenizer(target, model)

    def make(n: int, level: int = 0) -> list[BenchRequest]:
        data = _dataset(dataset, n, input_len, output_len, range_ratio, dataset_path,
                        prefix_len, num_prefixes, tokenizer, time_scale,
                        level_seed(seed, level))
        return assign_models(data.requests, _mix(mix), seed)

    approximate = _dataset(dataset, 1, input_len, output_len, range_ratio, dataset_path,
                           prefix_len, num_prefixes, tokenizer, time_scale, seed
                           ).approximate_counts if dataset != "sharegpt" else tokenizer is None
    with _target(target) as (url, models, engine_urls, plan, timing_notes):
        chosen = model or (models[0] if models else None)
        if chosen is None:
            served = asyncio.run(_served_models(url))
            if not served:
                raise InferplaneError("the target serves no model", field="TARGET",
                                      value=target, fix="pass --model")
            chosen = served[0]
        run, swept, server = asyncio.run(_measure(
            url, engine_urls, make, load, levels, num_requests, chosen, api, targets,
            max_duration_s, warmup, show_progress=not as_json,
        ))
    mixed = [name for name, _ in _mix(mix)]
    paid = _target_cost(plan, mixed or [chosen], gpu_hour_usd, gpus, price)
    summary = run.summary if run is not None else None
    document: dict[str, Any] = {
        "target": target, "model": chosen, "api": api, "dataset": dataset,
        "token_counts": "approximate (no tokenizer; server usage where reported)"
        if approximate else "tokenizer",
        "slo": targets,
    }
    if timing_notes:
        document["simulator_timing"] = timing_notes
    if run is not None:
        run.server = server
        document["run"] = run.as_dict()
        by_model = sorted({r.model for r in run.results})
        if len(by_model) > 1:  # a --mix: each model's own numbers over the same run
            from inferplane.bench.metrics import summarize

            document["run"]["per_model"] = {
                name: summarize([r for r in run.results if r.model == name],
                                run.summary.duration_s, targets).as_dict()
                for name in by_model
            }
    if swept is not None:
        document["sweep"] = {**swept.as_dict(), "server": server}
    warning = _cache_warning(dataset, server)
    if warning:
        document["warnings"] = [warning]
        typer.echo(f"warning: {warning}", err=True)
    measured = summary if summary is not None else (
        max((r.run.summary for r in swept.rows), key=lambda m: m.output_throughput)
        if swept is not None and swept.rows else None)  # a sweep: its best level
    if paid is not None and measured is not None:
        document["cost"] = cost_report(
            paid.usd_per_hour, measured.total_input_tokens / measured.duration_s,
            measured.output_throughput, api_cost)
        document["cost"].update(gpus=paid.gpus, gpus_counted=paid.counted)
    if out is not None:
        write_results(out, document, run, swept)
        _plots(out, run, swept)
    if as_json:
        typer.echo(json.dumps(document, indent=2))
        return
    _print(document, run, swept)


CACHE_WARN_RATE = 0.05  # random prompts share no prefix: a higher hit rate means reuse


def _cache_warning(dataset: str, server: dict[str, Any]) -> str | None:
    """A `random` run the server answered from its prefix cache measures the cache, not
    the prefill: say so rather than print a TTFT that is too good."""
    rate = server.get("prefix_cache_hit_rate")
    if dataset != "random" or rate is None or rate <= CACHE_WARN_RATE:
        return None
    return (f"the server's prefix-cache hit rate was {rate:.1%} on random prompts (expected "
            f"~0): other traffic or re-sent prompts were served from the cache, so TTFT is "
            "lower than a cold prefill; bench an idle target, or pass another --seed")


def _server_line(server: dict[str, Any], scope: str) -> str | None:
    if not server.get("scraped"):
        return None
    parts = []
    if "prefix_cache_hit_rate" in server:
        parts.append(f"prefix-cache hit rate {server['prefix_cache_hit_rate']:.1%}")
    if "preemptions" in server:
        parts.append(f"preemptions {server['preemptions']:.0f}")
    if "mean_queue_time_ms" in server:
        parts.append(f"mean queue time {server['mean_queue_time_ms']:.1f} ms")
    return f"server (/metrics delta{scope}): " + (", ".join(parts) or "no vLLM counters")


def _plots(out: Path, run: RunResult | None, swept: Sweep | None) -> None:
    """The PNGs beside bench.json; without matplotlib say how to get them (the JSON and
    CSV are written either way). On stderr, so `--json` output stays one document."""
    from inferplane.bench.plots import PlotsUnavailable, write_plots

    try:
        write_plots(out, run, swept)
    except PlotsUnavailable as exc:
        typer.echo(f"warning: no PNG plots written: {exc}", err=True)


async def _measure(
    url: str, engine_urls: list[str], make: Callable[[int, int], list[BenchRequest]],
    load: Any, levels: list[int] | None, num_requests: int, model: str, api: str,
    slo: dict[str, float], max_duration_s: float, warmup: int, *, show_progress: bool,
) -> tuple[RunResult | None, Sweep | None, dict[str, Any]]:
    from rich.console import Console
    from rich.progress import Progress

    from inferplane.bench import load as loads
    from inferplane.bench import scrape
    from inferplane.bench.datasets import WARMUP_LEVEL

    before = [await scrape.fetch(u) for u in engine_urls]
    console = Console(stderr=True)
    run: RunResult | None = None
    swept: Sweep | None = None
    with Progress(console=console, transient=True, disable=not show_progress) as progress:
        if levels is None:
            task = progress.add_task(f"{load.describe()}", total=num_requests)
            run = await loads.run_load(
                url, make(num_requests, 0), load, model=model, api=api, slo=slo,
                max_duration_s=max_duration_s, warmup=warmup,
                warmup_requests=make(warmup, WARMUP_LEVEL) if warmup else None,
                on_done=lambda _r: progress.advance(task),
            )
        else:
            task = progress.add_task("sweep", total=len(levels))

            def level_done(row: loads.SweepRow) -> None:
                progress.advance(task)
                s = row.run.summary
                progress.console.print(
                    f"concurrency {row.concurrency}: {s.output_throughput:.0f} tok/s, "
                    f"p99 E2EL {s.e2el_ms['p99']:.0f} ms", highlight=False)

            swept = await loads.sweep(
                url, lambda c: make(max(num_requests, 4 * c), c), levels, model=model,
                api=api, slo=slo, max_duration_s=max_duration_s, on_level=level_done,
                warmup=warmup, warmup_requests=make(warmup, WARMUP_LEVEL) if warmup else None,
            )
    after = [await scrape.fetch(u) for u in engine_urls]
    deltas = [scrape.server_delta(b, a) for b, a in zip(before, after, strict=True)]
    server = deltas[0] if len(deltas) == 1 else scrape.merge_deltas(deltas)
    server["scraped_at_unix_s"] = time.time()
    return run, swept, server


def _print(document: dict[str, Any], run: RunResult | None, swept: Sweep | None) -> None:
    from rich.console import Console
    from rich.table import Table

    from inferplane.bench.cost import describe

    console = Console(highlight=False)
    for note in document.get("simulator_timing", []):
        console.print(note, markup=False)
    if run is not None:
        s = run.summary
        console.print(f"[bold]{document['model']}[/] at {run.load.describe()}: "
                      f"{s.completed} completed, {s.failed} failed in {s.duration_s:.2f} s "
                      f"(token counts: {document['token_counts']})")
        table = Table("metric", "mean", "p50", "p90", "p99", title_justify="left")
        for name, key in (("TTFT (ms)", "ttft_ms"), ("TPOT (ms)", "tpot_ms"),
                          ("ITL (ms)", "itl_ms"), ("E2EL (ms)", "e2el_ms")):
            d = getattr(s, key)
            table.add_row(name, *(f"{d[k]:.2f}" for k in ("mean", "p50", "p90", "p99")))
        console.print(table)
        console.print(f"request throughput {s.request_throughput:.2f} req/s, output "
                      f"{s.output_throughput:.1f} tok/s, total {s.total_token_throughput:.1f} "
                      "tok/s" + (f", goodput {s.request_goodput:.2f} req/s"
                                 if s.request_goodput is not None else ""))
        line = _server_line(run.server, "")
        if line:
            console.print(line)
    if swept is not None:
        table = Table("concurrency", "p50 latency", "p99 latency", "p50 TTFT", "tok/s",
                      "req/s", "failed", title="saturation sweep", title_justify="left")
        for row in swept.rows:
            d = row.as_dict()
            mark = " <- knee" if row.concurrency == swept.knee else ""
            table.add_row(f"{row.concurrency}{mark}", f"{d['p50_e2el_ms']:.0f} ms",
                          f"{d['p99_e2el_ms']:.0f} ms", f"{d['p50_ttft_ms']:.0f} ms",
                          f"{d['output_throughput_tok_s']:.0f}",
                          f"{d['request_throughput_req_s']:.2f}", str(d["failed"]))
        console.print(table)
        knee = f"concurrency {swept.knee}" if swept.knee is not None else "not reached"
        console.print(f"knee (sweet spot): {knee}; stopped: {swept.stopped}")
        if document["slo"]:
            best = swept.best_within_slo
            console.print("best within the SLO (p99): " + (
                f"concurrency {best}" if best is not None else "no level meets it"))
        line = _server_line(document["sweep"]["server"], " over every level")
        if line:
            console.print(line)
    if "cost" in document:
        for line in describe(document["cost"]):
            console.print(line)
