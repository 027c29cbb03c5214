"""`inferplane estimate MODEL_DIR`: the GPU memory one vLLM instance will need."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from inferplane.cli.main import app
from inferplane.errors import USAGE_EXIT_CODE, InferplaneError

if TYPE_CHECKING:  # the estimator loads on use: `inferplane --help` stays fast
    from inferplane.estimator.types import MemoryEstimate


def json_keys() -> list[str]:
    """Keys of the --json object, in order; an invalid request prints them as null."""
    from inferplane.estimator.types import MemoryEstimate

    return [f.name for f in dataclasses.fields(MemoryEstimate)]


def parse_max_model_len(value: str | None) -> int | None:
    if value is None:
        return None
    if value.strip().lower() in ("auto", "-1"):
        from inferplane.estimator.memory import AUTO_MAX_MODEL_LEN

        return AUTO_MAX_MODEL_LEN
    try:
        parsed = int(value)
    except ValueError:
        raise InferplaneError(
            "not a number of tokens", field="--max-model-len", value=value,
            fix="give a positive integer such as 8192, or auto",
        ) from None
    if parsed < 1:
        raise InferplaneError(
            "must be positive", field="--max-model-len", value=value, fix="e.g. 8192 or auto"
        )
    return parsed


def _print_table(model_dir: Path, gpu_label: str, est: MemoryEstimate) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    title = f"{model_dir.name} on {gpu_label} (vLLM {est.vllm_version}, per GPU"
    if est.pipeline_parallel_size > 1:
        title += f" of pipeline stage {est.worst_rank} of {est.pipeline_parallel_size}, the one "
        title += "with the fewest KV blocks"
    table = Table(title=title + ")")
    table.add_column("item")
    table.add_column("value", justify="right")
    rows: list[tuple[str, str]] = [
        ("total memory", f"{est.total_memory_gib:.2f} GiB"),
        (f"requested (x {est.gpu_memory_utilization})", f"{est.requested_memory_gib:.2f} GiB"),
        ("weights", f"{est.weights_gib:.2f} GiB"),
        *([("LoRA adapter slots (KV cache gives them up)", f"{est.lora_gib:.2f} GiB")]
          if est.lora_gib else []),
        ("activation peak (profile run)", f"{est.activation_gib:.2f} GiB"),
        ("non-torch (NCCL, cuBLAS)", f"{est.non_torch_gib:.2f} GiB"),
        (
            "CUDA graphs" + ("" if est.cuda_graph_in_budget else " (outside budget)"),
            f"{est.cuda_graph_gib:.2f} GiB",
        ),
        ("KV cache available", f"{est.kv_cache_gib:.2f} GiB"),
        ("CUDA context (outside budget)", f"{est.cuda_context_gib:.2f} GiB"),
        ("KV bytes/token (model, all layers)", f"{est.kv_bytes_per_token:,}"),
        ("KV cache tokens", f"{est.kv_cache_tokens:,}"),
        ("max_model_len", f"{est.max_model_len:,}"),
        ("max concurrency at max_model_len", f"{est.max_concurrency:.2f}x"),
        ("max_num_seqs / max_num_batched_tokens",
         f"{est.max_num_seqs} / {est.max_num_batched_tokens}"),
        ("dtype / kv dtype / quantization",
         f"{est.dtype} / {est.kv_cache_dtype} / {est.quantization or 'none'}"),
        ("fits", "yes" if est.fits else "NO"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    if est.ranks:
        stages = Table(title="pipeline stages (per GPU; vLLM gives every stage the fewest blocks)")
        for column in ("stage", "layers", "weights", "activation", "CUDA graphs", "KV cache",
                       "KV blocks"):
            stages.add_column(column, justify="right")
        for rank in est.ranks:
            stages.add_row(
                str(rank.rank), f"{rank.start_layer}-{rank.end_layer - 1}",
                f"{rank.weights_gib:.2f} GiB", f"{rank.activation_gib:.2f} GiB",
                f"{rank.cuda_graph_gib:.2f} GiB", f"{rank.kv_cache_gib:.2f} GiB",
                f"{rank.num_gpu_blocks:,}",
            )
        console.print(stages)
    for warning in est.warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    for error in est.errors:
        console.print(f"[bold red]error:[/] {error}", highlight=False)


def _print_errors(est: MemoryEstimate) -> None:
    from rich.console import Console

    console = Console(highlight=False)
    for error in est.errors:
        console.print(f"[bold red]error:[/] {error}")


def _lora_slots(max_loras: int | None, max_lora_rank: int | None, slots: Any) -> Any:
    """LoraSlots when either LoRA option is given (the other at vLLM's default)."""
    from inferplane.spec.lora import VLLM_LORA_RANKS

    if max_loras is None and max_lora_rank is None:
        return None
    loras, rank = max_loras or 1, max_lora_rank or 16
    if loras < 1:
        raise InferplaneError("must be at least 1", field="--max-loras", value=loras,
                              fix="e.g. 4")
    if rank not in VLLM_LORA_RANKS:
        raise InferplaneError(
            "vLLM accepts only some ranks", field="--max-lora-rank", value=rank,
            fix=f"use one of {', '.join(map(str, VLLM_LORA_RANKS))}")
    return slots(max_loras=loras, max_lora_rank=rank)


@app.command()
def estimate(
    model_dir: Path = typer.Argument(..., help="Model directory (config.json, safetensors)."),
    gpu: str | None = typer.Option(None, "--gpu", help="GPU name, e.g. H100, L40S, A100-40GB."),
    gpu_memory_gib: float | None = typer.Option(
        None, "--gpu-memory-gib", help="Total GPU memory as CUDA reports it, instead of --gpu."
    ),
    tensor_parallel_size: int = typer.Option(1, "--tensor-parallel-size", "-tp"),
    pipeline_parallel_size: int = typer.Option(
        1, "--pipeline-parallel-size", "-pp", help="Pipeline stages (nodes), each with TP GPUs."
    ),
    gpu_memory_utilization: float | None = typer.Option(
        None, "--gpu-memory-utilization",
        help="Fraction of each card; default: the release's (0.9, 0.92 from vLLM 0.21).",
    ),
    max_model_len: str | None = typer.Option(None, "--max-model-len", help="Tokens, or auto."),
    max_num_seqs: int | None = typer.Option(None, "--max-num-seqs"),
    max_num_batched_tokens: int | None = typer.Option(None, "--max-num-batched-tokens"),
    dtype: str = typer.Option("auto", "--dtype"),
    quantization: str | None = typer.Option(None, "--quantization"),
    kv_cache_dtype: str = typer.Option("auto", "--kv-cache-dtype"),
    kv_cache_memory_gib: float | None = typer.Option(
        None, "--kv-cache-memory-gib", help="Fixed KV pool, like vLLM's --kv-cache-memory."
    ),
    enforce_eager: bool = typer.Option(False, "--enforce-eager"),
    vllm_version: str | None = typer.Option(None, "--vllm-version"),
    max_loras: int | None = typer.Option(
        None, "--max-loras", help="With LoRA: adapters in one batch (GPU slots reserved)."
    ),
    max_lora_rank: int | None = typer.Option(
        None, "--max-lora-rank", help="With LoRA: the rank every slot is sized for (16)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Estimate per-GPU memory, KV cache tokens and max concurrency the way vLLM counts them."""
    from inferplane.engines.vllm.versions import (
        DEFAULT_VLLM_VERSION,
        default_gpu_memory_utilization,
    )
    from inferplane.estimator.lora import LoraSlots
    from inferplane.estimator.memory import estimate_memory
    from inferplane.estimator.types import EngineSettings
    from inferplane.gpus import lookup_gpu
    from inferplane.gpus.spec import GIB
    from inferplane.models import load_profile

    try:
        if gpu_memory_utilization is None:
            gpu_memory_utilization = default_gpu_memory_utilization(
                vllm_version or DEFAULT_VLLM_VERSION)
        if gpu is not None and gpu_memory_gib is not None:
            raise InferplaneError(
                "give either --gpu or --gpu-memory-gib, not both", field="--gpu", value=gpu,
                fix="drop one of them",
            )
        if gpu is None and gpu_memory_gib is None:
            raise InferplaneError(
                "no GPU given", field="--gpu", fix="pass --gpu NAME (see `inferplane gpus`) "
                "or --gpu-memory-gib X",
            )
        if gpu_memory_gib is not None and gpu_memory_gib <= 0:
            raise InferplaneError(
                "must be positive", field="--gpu-memory-gib", value=gpu_memory_gib,
                fix="e.g. 79.19 for an H100",
            )
        profile = load_profile(model_dir)
        lora = _lora_slots(max_loras, max_lora_rank, LoraSlots)
        gpu_spec = lookup_gpu(gpu) if gpu else None
        settings = EngineSettings(
            tensor_parallel_size=tensor_parallel_size,
            pipeline_parallel_size=pipeline_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=parse_max_model_len(max_model_len),
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            dtype=dtype,
            quantization=quantization,
            kv_cache_dtype=kv_cache_dtype,
            kv_cache_memory_bytes=(
                int(kv_cache_memory_gib * GIB) if kv_cache_memory_gib is not None else None
            ),
            enforce_eager=enforce_eager,
            vllm_version=vllm_version,
            lora=lora,
        )
        result = estimate_memory(
            profile,
            settings,
            gpu=gpu_spec,
            gpu_memory_bytes=int(gpu_memory_gib * GIB) if gpu_memory_gib is not None else None,
        )
    except InferplaneError as exc:
        if not as_json:
            raise
        invalid: dict[str, Any] = dict.fromkeys(json_keys())
        invalid.update(fits=False, warnings=[], errors=[exc.render()])
        typer.echo(json.dumps(invalid, indent=2))
        raise typer.Exit(USAGE_EXIT_CODE) from None

    from inferplane.estimator.rules import pipeline_parallel_errors, tensor_parallel_errors

    if as_json:
        typer.echo(json.dumps(dataclasses.asdict(result), indent=2))
    elif tensor_parallel_errors(profile, tensor_parallel_size) or pipeline_parallel_errors(
            profile, pipeline_parallel_size):
        _print_errors(result)  # settings vLLM refuses: a table of their numbers is nonsense
    else:
        label = gpu_spec.name if gpu_spec else f"{gpu_memory_gib} GiB GPU"
        _print_table(model_dir, label, result)
    if not result.fits:
        raise typer.Exit(USAGE_EXIT_CODE)
