"""`inferplane plan FLEET.yaml`: place every replica of every model on the GPU inventory."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from inferplane.cli.main import app
from inferplane.cli.tables import Col, fitted_table, measure, table_width
from inferplane.errors import InferplaneError

if TYPE_CHECKING:  # the planner (OR-Tools) loads on use: `inferplane --help` stays fast
    from inferplane.gpus.discovery import DiscoveredGpu
    from inferplane.planner.plan import InstanceMemory, Plan, PlanGpu, PlanInstance


@app.command()
def plan(
    fleet_file: Path = typer.Argument(..., help="Fleet file (YAML).", show_default=False),
    policy: str = typer.Option("binpack", "--policy", help="binpack (default) or spread."),
    as_json: bool = typer.Option(False, "--json", help="Print the Plan as JSON."),
    out: Path | None = typer.Option(None, "--out", help="Also write the Plan JSON here."),
    time_limit_s: float = typer.Option(
        5.0, "--time-limit-s", help="Solver time limit (deterministic seconds); 0: greedy only."
    ),
    card_budget: float = typer.Option(
        0.95, "--card-budget", help="Fraction of each card the plan may use (P01)."
    ),
    objective: str | None = typer.Option(
        None, "--objective", show_default=False,
        help="utilize (GPUs you own) or min_gpus (GPUs you rent); default: the fleet's "
             "planning.objective.",
    ),
) -> None:
    """Size every model, place every replica, print the per-GPU memory split. Exit 2 with
    what would make it fit when it does not."""
    if policy not in ("binpack", "spread"):
        raise InferplaneError(
            "unknown policy", field="--policy", value=policy, fix="use binpack or spread"
        )
    if time_limit_s < 0:
        raise InferplaneError(
            "must be >= 0", field="--time-limit-s", value=time_limit_s, fix="e.g. 5"
        )
    if objective not in (None, "utilize", "min_gpus"):
        raise InferplaneError(
            "unknown objective", field="--objective", value=objective,
            fix="use utilize or min_gpus",
        )
    from inferplane.gpus.discovery import discover_gpus
    from inferplane.planner.build import plan_fleet
    from inferplane.spec import load_fleet

    fleet = load_fleet(fleet_file)
    discovered: list[DiscoveredGpu] | None = discover_gpus() if fleet.discover_gpus else None
    result = plan_fleet(
        fleet,
        policy="spread" if policy == "spread" else "binpack",
        card_budget_fraction=card_budget,
        time_limit_s=time_limit_s,
        discovered=discovered,
        fleet_file=str(fleet_file),
        objective="min_gpus" if objective == "min_gpus" else
        "utilize" if objective == "utilize" else None,
    )
    text = result.model_dump_json(indent=2)
    if out is not None:
        out.write_text(text + "\n", encoding="utf-8")
    if as_json:
        typer.echo(text)
        return
    print_plan(result, Console(highlight=False))


GPU_COLUMNS = (
    Col("GPU"), Col("instances (utilization)", "instances (util)", wrap=True),
    Col("weights", drop=3, justify="right"), Col("KV cache", "KV", drop=2, justify="right"),
    Col("overhead", "ovh", drop=4, justify="right"),
    Col("used / budget", "used/budget", justify="right"), Col("free", drop=5, justify="right"),
)  # fmt: skip
INSTANCE_COLUMNS = (
    Col("id"), Col("node", drop=6), Col("GPUs"), Col("TP", drop=3), Col("util"),
    Col("max len", "len", drop=2), Col("concurrency", "conc", drop=4), Col("port", drop=5),
    Col("start after", "after", drop=7, wrap=True),
)  # fmt: skip
RANK_COLUMNS = (
    Col("id"), Col("rank"), Col("node"), Col("GPUs", drop=4), Col("layers", drop=3),
    Col("weights", drop=2), Col("KV cache", "KV", drop=1), Col("command", wrap=True),
)  # fmt: skip


def print_plan(plan: Plan, console: Console) -> None:
    """Per node: one row per GPU with its memory split, like `nvidia-smi` after start-up.
    In a narrow terminal (80 columns) the cells get compact (GiB without the unit, one
    instance per line) and the least needed columns are hidden (`--json` has all)."""
    if plan.device == "cpu":
        from inferplane.cli.plan_cpu import print_cpu_plan

        print_cpu_plan(plan, console)
        return
    width = console.width
    by_id = {inst.id: inst for inst in plan.instances}
    for node in dict.fromkeys(g.node for g in plan.gpus):
        gpus = [g for g in plan.gpus if g.node == node]
        title = f"{node} ({gpus[0].type}, budget {plan.card_budget_fraction:g})"
        here = {g.index: [_memory_on(by_id[i], g) for i in g.instances] for g in gpus}
        rows = [_gpu_row(gpu, here[gpu.index]) for gpu in gpus]
        if table_width(measure(GPU_COLUMNS, rows)) > width:
            rows = [_gpu_row(gpu, here[gpu.index], compact=True) for gpu in gpus]
            title += ", GiB"
        console.print(fitted_table(GPU_COLUMNS, rows, width, title))
    rows = [[
        inst.id, inst.node, ",".join(str(i) for i in inst.gpu_indices),
        str(inst.tensor_parallel_size), f"{inst.gpu_memory_utilization:.4g}",
        str(inst.max_model_len), f"{inst.memory.max_concurrency:.1f}x", str(inst.port),
        ", ".join(inst.start_after) or "-",
    ] for inst in plan.instances]  # fmt: skip
    columns: tuple[Col, ...] = INSTANCE_COLUMNS
    if len({inst.node for inst in plan.instances}) > 1:  # the node beats port and length
        columns = tuple(replace(c, drop=0) if c.header == "node" else c for c in columns)
    if table_width(measure(columns, rows)) > width:
        for row in rows:
            row[-1] = row[-1].replace(", ", "\n")
    console.print(fitted_table(columns, rows, width, "instances"))
    spanning = [inst for inst in plan.instances if inst.ranks]
    if spanning:
        console.print(_ranks_table(spanning, width))
    t = plan.totals
    console.print(
        f"GPUs used {t.gpus_used} of {t.gpus_total} ({t.gpus_idle} idle); needed at peak "
        f"coexistence: {t.gpus_needed_at_peak}; memory efficiency {t.memory_efficiency:.1%}; "
        f"fragmentation {t.fragmentation:.2f}; objective {plan.objective}; solver {t.solver}"
        + (" (optimal)" if t.solver_optimal else "")
    )
    print_lora_lines(plan, console)
    for warning in plan.warnings:
        # no highlighter: it colours digits inside names (qwen3-embedding-0.6b)
        console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)


def print_lora_lines(plan: Plan, console: Console) -> None:
    """One line per instance that reserves LoRA adapter slots: what and how much."""
    from inferplane.engines import engine_for  # not at import: `--help` stays light

    where = "of host memory" if plan.device == "cpu" else "per GPU"
    for inst in plan.instances:
        if not inst.memory.lora_gib:
            continue
        launch = engine_for("vllm").planned(inst.argv, inst.env)
        console.print(
            f"LoRA: {inst.id} reserves {inst.memory.lora_gib:.2f} GiB {where} for "
            f"{launch.flag('max-loras')} adapter slot(s) at rank {launch.flag('max-lora-rank')}"
            f"; its KV cache is that much smaller ({len(launch.lora_paths())} adapter(s) "
            "loaded at start)", highlight=False)


def _memory_on(inst: PlanInstance, gpu: PlanGpu) -> tuple[PlanInstance, InstanceMemory]:
    """The instance and its memory on `gpu`: its pipeline stage's for a spanning replica."""
    for rank in inst.ranks:
        if rank.node == gpu.node and gpu.index in rank.gpu_indices and rank.memory:
            return inst, rank.memory
    return inst, inst.memory


def _ranks_table(spanning: list[PlanInstance], width: int) -> Table:
    """One row per node of every replica that spans nodes (pipeline stages)."""
    rows = []
    for inst in spanning:
        for rank in inst.ranks:
            memory = rank.memory or inst.memory
            layers = f"{rank.layers[0]}-{rank.layers[1] - 1}" if rank.layers else "-"
            rows.append([
                inst.id, f"{rank.rank}/{inst.pipeline_parallel_size}", rank.node,
                ",".join(str(i) for i in rank.gpu_indices), layers,
                _gib(memory.weights_gib), _gib(memory.kv_cache_gib), _command(rank.argv),
            ])  # fmt: skip
    title = "replicas that span nodes (one row per node; rank 0 serves the API)"
    return fitted_table(RANK_COLUMNS, rows, width, title)


def _command(argv: list[str]) -> str:
    """What tells the ranks apart: the multi-node flags, or the Ray role."""
    if argv[:2] == ["bash", "-c"]:
        return "ray head, then vllm serve" if "--head" in argv[2] else "ray worker"
    from inferplane.engines import engine_for  # not at import: `--help` stays light
    from inferplane.engines.vllm.launch import RANK_OPTION

    launch = engine_for("vllm").planned(argv)
    role = "vllm serve --headless" if launch.flag("headless") is not None else "vllm serve (API)"
    rank = launch.flag(RANK_OPTION) or "?"
    return f"{role} --node-rank {rank}"


def _gpu_row(
    gpu: PlanGpu, here: list[tuple[PlanInstance, InstanceMemory]], compact: bool = False
) -> list[str]:
    weights = sum(m.weights_gib for _, m in here)
    kv = sum(m.kv_cache_gib for _, m in here)
    overhead = gpu.used_gib - weights - kv
    sep = "\n" if compact else ", "
    names = sep.join(f"{i.id} ({i.gpu_memory_utilization:.4g})" for i, _ in here) or "idle"
    gib = (lambda v: f"{v:.2f}") if compact else _gib
    used = f"{gpu.used_gib:.2f}/{gpu.budget_gib:.2f}" if compact else (
        f"{gpu.used_gib:.2f} / {gpu.budget_gib:.2f} GiB")
    return [str(gpu.index), names, gib(weights), gib(kv), gib(overhead), used, gib(gpu.free_gib)]


def _gib(value: float) -> str:
    return f"{value:.2f} GiB"
