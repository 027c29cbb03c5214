"""`inferplane plan FLEET.yaml`: place every replica of every model on the GPU inventory."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from inferplane.cli.main import app
from inferplane.errors import InferplaneError
from inferplane.gpus.discovery import DiscoveredGpu, discover_gpus
from inferplane.planner.build import plan_fleet
from inferplane.planner.plan import Plan, PlanGpu, PlanInstance
from inferplane.spec import load_fleet


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
    fleet = load_fleet(fleet_file)
    discovered: list[DiscoveredGpu] | None = discover_gpus() if fleet.discover_gpus else None
    result = plan_fleet(
        fleet,
        policy="spread" if policy == "spread" else "binpack",
        card_budget_fraction=card_budget,
        time_limit_s=time_limit_s,
        discovered=discovered,
        fleet_file=str(fleet_file),
    )
    text = result.model_dump_json(indent=2)
    if out is not None:
        out.write_text(text + "\n", encoding="utf-8")
    if as_json:
        typer.echo(text)
        return
    print_plan(result, Console(highlight=False, width=max(Console().width, 150)))


def print_plan(plan: Plan, console: Console) -> None:
    """Per node: one row per GPU with its memory split, like `nvidia-smi` after start-up."""
    by_id = {inst.id: inst for inst in plan.instances}
    for node in dict.fromkeys(g.node for g in plan.gpus):
        gpus = [g for g in plan.gpus if g.node == node]
        table = Table(title=f"{node} ({gpus[0].type}, budget {plan.card_budget_fraction:g})")
        for column in ("GPU", "instances (utilization)", "weights", "KV cache", "overhead",
                       "used / budget", "free"):
            table.add_column(column, justify="left" if column.startswith("inst") else "right")
        for gpu in gpus:
            table.add_row(*_gpu_row(gpu, [by_id[i] for i in gpu.instances]))
        console.print(table)
    instances = Table(title="instances")
    for column in ("id", "node", "GPUs", "TP", "util", "max len", "concurrency", "port",
                   "start after"):
        instances.add_column(column)
    for inst in plan.instances:
        instances.add_row(
            inst.id, inst.node, ",".join(str(i) for i in inst.gpu_indices),
            str(inst.tensor_parallel_size), f"{inst.gpu_memory_utilization:.4g}",
            str(inst.max_model_len), f"{inst.memory.max_concurrency:.1f}x", str(inst.port),
            ", ".join(inst.start_after) or "-",
        )
    console.print(instances)
    t = plan.totals
    console.print(
        f"GPUs used {t.gpus_used} of {t.gpus_total} ({t.gpus_idle} idle); needed at peak "
        f"coexistence: {t.gpus_needed_at_peak}; memory efficiency {t.memory_efficiency:.1%}; "
        f"fragmentation {t.fragmentation:.2f}; solver {t.solver}"
        + (" (optimal)" if t.solver_optimal else "")
    )
    for warning in plan.warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}")


def _gpu_row(gpu: PlanGpu, here: list[PlanInstance]) -> list[str]:
    weights = sum(i.memory.weights_gib for i in here)
    kv = sum(i.memory.kv_cache_gib for i in here)
    overhead = gpu.used_gib - weights - kv
    names = ", ".join(f"{i.id} ({i.gpu_memory_utilization:.4g})" for i in here) or "idle"
    return [
        str(gpu.index), names, _gib(weights), _gib(kv), _gib(overhead),
        f"{gpu.used_gib:.2f} / {gpu.budget_gib:.2f} GiB", _gib(gpu.free_gib),
    ]


def _gib(value: float) -> str:
    return f"{value:.2f} GiB"
