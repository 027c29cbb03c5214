"""`inferplane sim`: run simulated vLLM engines (one, or a fleet file of many)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from inferplane.cli.main import app
from inferplane.errors import InferplaneError

if TYPE_CHECKING:  # the simulator (starlette, aiohttp) loads on use
    from inferplane.sim.config import SimEngineConfig

# The simulator's DEFAULT_GPU, spelled here so `--help` needs no simulator import (a test
# keeps the two equal).
DEFAULT_GPU = "H100-SXM-80GB"
# How long a simulated engine whose core died answers /health 503 before it exits 0 (vLLM:
# its watchdog notices the dead engine and stops the server).
ENGINE_DEATH_EXIT_S = 1.0


def _keys() -> tuple[set[str], set[str]]:
    from inferplane.sim.config import FaultConfig, SimEngineConfig

    faults = set(FaultConfig.__dataclass_fields__)
    engine = set(SimEngineConfig.__dataclass_fields__) - {"faults", "calibration"}
    return faults, engine


def _engine_from_mapping(entry: dict[str, Any], where: str) -> SimEngineConfig:
    from inferplane.sim.config import FaultConfig, SimEngineConfig

    fault_keys, engine_keys = _keys()
    unknown = set(entry) - fault_keys - engine_keys
    if unknown:
        raise InferplaneError(
            f"unknown keys {sorted(unknown)}", location=where,
            fix=f"use only {sorted(engine_keys | fault_keys)}",
        )
    if "model" not in entry:
        raise InferplaneError("missing key 'model'", location=where, fix="name the served model")
    faults = FaultConfig(**{k: v for k, v in entry.items() if k in fault_keys})
    values = {k: v for k, v in entry.items() if k in engine_keys}
    for key in ("model_dir", "model_config"):
        if values.get(key) is not None:
            values[key] = Path(values[key])
    if values.get("lora") is not None:
        from inferplane.sim.lora import lora_from_mapping

        values["lora"] = lora_from_mapping(values["lora"], f"{where}.lora")
    return SimEngineConfig(**values, faults=faults)


def load_fleet(path: Path) -> list[SimEngineConfig]:
    """A YAML file `engines: [{model: ..., port: ..., <any sim flag in snake_case>}, ...]`."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise InferplaneError(f"cannot read fleet file: {exc}", location=str(path)) from exc
    engines = data.get("engines") if isinstance(data, dict) else None
    if not isinstance(engines, list) or not engines:
        raise InferplaneError(
            "needs a non-empty list under 'engines'", location=str(path),
            fix="engines:\n  - {model: demo-a, port: 8001}",
        )
    return [
        _engine_from_mapping(entry, f"{path}: engines[{i}]") if isinstance(entry, dict)
        else _engine_from_mapping({}, f"{path}: engines[{i}]")
        for i, entry in enumerate(engines)
    ]


async def _serve(configs: list[SimEngineConfig], exit_on_crash: bool) -> int:
    from inferplane.sim.app import log_requests
    from inferplane.sim.host import start_engines, stop_engines
    from inferplane.sim.startup_log import startup_lines

    log_requests()  # each request's id in the engine's log, as vLLM logs it
    handles = await start_engines(configs)
    for handle in handles:
        for line in startup_lines(handle.engine.parts, os.getpid()):  # as vLLM logs them
            typer.echo(line)
        typer.echo(f"simulated engine {handle.config.model} listening on {handle.url}")
    crashed = [asyncio.ensure_future(h.crashed.wait()) for h in handles]
    died = [asyncio.ensure_future(h.died.wait()) for h in handles]
    try:
        if exit_on_crash:
            await asyncio.wait([*crashed, *died], return_when=asyncio.FIRST_COMPLETED)
            if any(task.done() for task in crashed):
                typer.echo("simulated crash (--crash-after-requests)", err=True)
                return 1
            # vLLM: the API server answers /health 503 until its watchdog stops it: code 0
            typer.echo("simulated engine death (--die-after-tokens): EngineCore encountered "
                       "an issue", err=True)
            await asyncio.sleep(ENGINE_DEATH_EXIT_S)
            return 0
        await asyncio.Event().wait()
        return 0
    finally:
        for task in [*crashed, *died]:
            task.cancel()
        await stop_engines(handles)


@app.command()
def sim(
    model: str = typer.Option("sim-model", help="Served model name clients send."),
    model_dir: Path | None = typer.Option(None, help="Model directory with config.json."),
    model_config: Path | None = typer.Option(None, help="config.json path (no model dir)."),
    gpu: str = typer.Option(DEFAULT_GPU, help="GPU type to simulate (see `inferplane gpus`)."),
    tensor_parallel_size: int = typer.Option(1, help="GPUs per engine."),
    max_model_len: int | None = typer.Option(None, help="Context length; default: the model's."),
    max_num_seqs: int | None = typer.Option(None, help="Max running sequences per step."),
    max_num_batched_tokens: int | None = typer.Option(None, help="Token budget per step."),
    gpu_memory_utilization: float = typer.Option(0.9, help="Fraction of the card for vLLM."),
    kv_cache_memory_bytes: int | None = typer.Option(
        None, help="KV cache pool per GPU in bytes (vLLM's --kv-cache-memory-bytes)."
    ),
    host: str = typer.Option("127.0.0.1", help="Address to bind."),
    port: int = typer.Option(8000, help="Port to bind."),
    load_time_s: float = typer.Option(0.0, help="Seconds /health answers 503 before ready."),
    fail_rate: float = typer.Option(0.0, help="Fraction of requests answered with HTTP 500."),
    crash_after_requests: int | None = typer.Option(None, help="Exit (code 1) after N requests."),
    hang_after_requests: int | None = typer.Option(None, help="Stop answering after N requests."),
    die_after_tokens: int | None = typer.Option(
        None, help="The engine core dies after N streamed tokens, as vLLM's does: error "
        "event in flight streams, /health 503, exit code 0."
    ),
    slowdown: float = typer.Option(1.0, help="Multiply every step time by this factor."),
    max_logprobs: int = typer.Option(
        20, help="Most logprobs a request may ask for (vLLM's --max-logprobs)."
    ),
    enable_auto_tool_choice: bool = typer.Option(
        False, help="Answer tool_choice 'auto' with text (vLLM's --enable-auto-tool-choice)."
    ),
    tool_call_parser: str | None = typer.Option(
        None, help="vLLM's --tool-call-parser (forced tool calls need one; e.g. hermes)."
    ),
    runner: str = typer.Option(
        "auto", help="auto (task from the checkpoint), generate or pooling (vLLM's --runner)."
    ),
    enable_lora: bool = typer.Option(False, help="Serve LoRA adapters (vLLM's --enable-lora)."),
    max_loras: int = typer.Option(1, help="Distinct adapters in one batch (--max-loras)."),
    max_lora_rank: int = typer.Option(16, help="Largest adapter rank (--max-lora-rank)."),
    max_cpu_loras: int | None = typer.Option(
        None, help="Adapters kept in host memory (--max-cpu-loras; default max-loras)."
    ),
    lora_modules: list[str] = typer.Option(
        [], help="NAME=PATH of an adapter loaded at start (--lora-modules); repeatable."
    ),
    lora_load_time_s: float | None = typer.Option(
        None, help="Seconds to read one adapter from disk (default: from its file size)."
    ),
    fleet: Path | None = typer.Option(None, help="YAML file of many engines to host at once."),
) -> None:
    """Run a simulated vLLM engine (same HTTP API and metrics) without a GPU.

    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True opens /v1/load_lora_adapter and
    /v1/unload_lora_adapter, as it does for vLLM."""
    from inferplane.sim.config import FaultConfig, SimEngineConfig
    from inferplane.sim.lora import lora_config

    if fleet is not None:
        configs = load_fleet(fleet)
    else:
        configs = [SimEngineConfig(
            model=model, model_dir=model_dir, model_config=model_config, gpu=gpu,
            tensor_parallel_size=tensor_parallel_size, max_model_len=max_model_len,
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            gpu_memory_utilization=gpu_memory_utilization,
            kv_cache_memory_bytes=kv_cache_memory_bytes, host=host, port=port,
            max_logprobs=max_logprobs, enable_auto_tool_choice=enable_auto_tool_choice,
            tool_call_parser=tool_call_parser, runner=runner,
            lora=lora_config(
                enable_lora, max_loras=max_loras, max_lora_rank=max_lora_rank,
                max_cpu_loras=max_cpu_loras, modules=lora_modules,
                load_time_s=lora_load_time_s,
            ),
            faults=FaultConfig(
                load_time_s=load_time_s, fail_rate=fail_rate,
                crash_after_requests=crash_after_requests,
                hang_after_requests=hang_after_requests, slowdown=slowdown,
                die_after_tokens=die_after_tokens,
            ),
        )]
    try:
        code = asyncio.run(_serve(configs, exit_on_crash=fleet is None))
    except KeyboardInterrupt:
        code = 0
    except OSError as exc:
        raise InferplaneError(
            f"cannot listen: {exc}", field="port", fix="pick a free port (or 0 for any)"
        ) from exc
    sys.exit(code)
