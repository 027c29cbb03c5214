"""`inferplane plan` output for a CPU fleet: per node its RAM split, per instance its cores."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from inferplane.cli.tables import Col, fitted_table

if TYPE_CHECKING:
    from inferplane.planner.plan import Plan

NODE_COLUMNS = (
    Col("node"), Col("cores"), Col("instances", wrap=True),
    Col("weights", drop=2, justify="right"), Col("KV cache", "KV", drop=1, justify="right"),
    Col("runtime", drop=3, justify="right"), Col("used / budget", "used/budget", justify="right"),
    Col("free", drop=4, justify="right"),
)  # fmt: skip
INSTANCE_COLUMNS = (
    Col("id"), Col("node", drop=5), Col("cores"), Col("max len", "len", drop=2),
    Col("KV cache", "KV", justify="right"), Col("concurrency", "conc", drop=3),
    Col("port", drop=4), Col("shares cores with", "shares", drop=6, wrap=True),
)  # fmt: skip


def print_cpu_plan(plan: Plan, console: Console) -> None:
    from inferplane.engines.vllm.cpu import threads_bind

    width = console.width
    by_id = {inst.id: inst for inst in plan.instances}
    rows = []
    for node in plan.cpus:
        here = [by_id[i] for i in node.instances if i in by_id]
        rows.append([
            node.node, threads_bind(node.cores) if node.cores else "-",
            ", ".join(i.id for i in here) or "idle",
            _gib(sum(i.memory.weights_gib for i in here)),
            _gib(sum(i.memory.kv_cache_gib for i in here)),
            _gib(sum(i.memory.non_torch_gib for i in here)),
            f"{node.used_gib:.2f} / {node.budget_gib:.2f} GiB", _gib(node.free_gib),
        ])  # fmt: skip
    title = f"CPU nodes (vLLM CPU build, RAM budget {plan.card_budget_fraction:g})"
    console.print(fitted_table(NODE_COLUMNS, rows, width, title))
    rows = [[
        inst.id, inst.node, threads_bind(inst.cpu_cores) if inst.cpu_cores else "-",
        str(inst.max_model_len), _gib(inst.memory.kv_cache_gib),
        f"{inst.memory.max_concurrency:.1f}x", str(inst.port),
        ", ".join(inst.shares_gpu_with) or "-",
    ] for inst in plan.instances]  # fmt: skip
    console.print(fitted_table(INSTANCE_COLUMNS, rows, width, "instances"))
    t = plan.totals
    console.print(f"RAM efficiency {t.memory_efficiency:.1%}; solver {t.solver}")
    from inferplane.cli.plan import print_lora_lines

    print_lora_lines(plan, console)
    for warning in plan.warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}")


def _gib(value: float) -> str:
    return f"{value:.2f} GiB"
