"""A fake `vllm` executable: `vllm serve` command lines answered by the simulated engine.

    python -m inferplane.sim.fake_vllm serve MODEL --served-model-name N --port P \\
        --max-model-len L --tensor-parallel-size T --gpu-memory-utilization U [...]

It accepts the command lines `inferplane plan` writes (and vLLM's other serve flags): the
flags the simulator models (served name, host, port, context length, TP, utilization,
`--max-num-seqs`, `--max-num-batched-tokens`, prefix caching, `--max-logprobs`,
`--enable-auto-tool-choice` with `--tool-call-parser`, `--runner`/`--task embed`,
`--kv-cache-memory-bytes`, `--enable-lora` with `--max-loras`, `--max-lora-rank`,
`--max-cpu-loras` and `--lora-modules`) configure the simulated engine; GPU-only flags
(`--compilation-config`, `--dtype`, `--quantization`, ...) are accepted and ignored. Point
`inferplane up` at it with `--vllm-binary` or `INFERPLANE_VLLM_BINARY` to run an
`engine: vllm` fleet without a GPU:

    INFERPLANE_VLLM_BINARY="python -m inferplane.sim.fake_vllm" inferplane up f.yaml

Like vLLM it needs `CUDA_VISIBLE_DEVICES` to name at least `--tensor-parallel-size`
devices when the variable is set (P21), and it logs the devices it was given. Options only
the fake knows (anywhere on the line): `--gpu TYPE` (simulated GPU, default the
simulator's), `--load-time-s S`, `--crash-after-requests N`, `--hang-after-requests N`,
`--lora-load-time-s S` (reading one adapter), `--die-after-tokens N` (the engine core
dies as vLLM's does: error event, /health 503, exit code 0).
MODEL is a directory with `config.json` (the simulator reads the architecture from it) or
any name (the simulator's default profile).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from inferplane.sim.config import DEFAULT_GPU, FaultConfig, SimEngineConfig
from inferplane.sim.host import start_engine
from inferplane.sim.lora import lora_config
from inferplane.sim.startup_log import startup_lines

ENGINE_DEATH_EXIT_S = 1.0  # as `inferplane sim` (cli/sim.py): /health 503, then exit 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fake-vllm", description="vLLM's `serve` command on the simulated engine",
        allow_abbrev=False,
    )
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("model")
    parser.add_argument("--served-model-name", nargs="+", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument(
        "--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True
    )
    parser.add_argument("--max-logprobs", type=int, default=20)
    parser.add_argument("--enable-auto-tool-choice", action="store_true")
    parser.add_argument("--tool-call-parser", default=None)
    parser.add_argument("--kv-cache-memory-bytes", type=human_readable_int, default=None)
    parser.add_argument("--runner", choices=["auto", "generate", "pooling"], default="auto")
    parser.add_argument("--tokenizer-mode", default="auto")
    parser.add_argument("--task", default=None)  # before vLLM 0.10.2: --task embed
    parser.add_argument("--enable-lora", action="store_true")
    parser.add_argument("--max-loras", type=int, default=1)
    parser.add_argument("--max-lora-rank", type=int, default=16)
    parser.add_argument("--max-cpu-loras", type=int, default=None)
    parser.add_argument("--lora-modules", nargs="+", default=[])
    parser.add_argument("--lora-load-time-s", type=float, default=None)
    parser.add_argument("--gpu", default=DEFAULT_GPU)
    parser.add_argument("--load-time-s", type=float, default=0.0)
    parser.add_argument("--crash-after-requests", type=int, default=None)
    parser.add_argument("--hang-after-requests", type=int, default=None)
    parser.add_argument("--die-after-tokens", type=int, default=None)
    return parser


_UNITS = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_readable_int(value: str) -> int:
    """vLLM's `human_readable_int`: `64M` is 64 MiB, `1g` 10^9, `1048576` itself."""
    text = value.strip()
    if text and text[-1] in _UNITS:
        return int(float(text[:-1]) * _UNITS[text[-1]])
    return int(text)


def parse_serve_args(argv: Sequence[str]) -> tuple[SimEngineConfig, list[str]]:
    """The simulated engine for a `vllm serve` command line, and the flags ignored."""
    args, ignored = _parser().parse_known_args(list(argv))
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        # vLLM refuses this at start-up (validate_parsed_serve_args) with these words.
        raise SystemExit("Error: --enable-auto-tool-choice requires --tool-call-parser")
    source = Path(args.model)
    model_dir = source if (source / "config.json").is_file() else None
    served = args.served_model_name[0] if args.served_model_name else args.model
    config = SimEngineConfig(
        model=served,
        model_dir=model_dir,
        gpu=args.gpu,
        tensor_parallel_size=args.tensor_parallel_size,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enable_prefix_caching=args.enable_prefix_caching,
        max_logprobs=args.max_logprobs,
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        tool_call_parser=args.tool_call_parser,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        runner="pooling" if args.task in ("embed", "embedding") else args.runner,
        tokenizer_mode=args.tokenizer_mode,
        lora=lora_config(
            args.enable_lora, max_loras=args.max_loras, max_lora_rank=args.max_lora_rank,
            max_cpu_loras=args.max_cpu_loras, modules=args.lora_modules,
            load_time_s=args.lora_load_time_s,
        ),
        host=args.host,
        port=args.port,
        faults=FaultConfig(
            load_time_s=args.load_time_s,
            crash_after_requests=args.crash_after_requests,
            hang_after_requests=args.hang_after_requests,
            die_after_tokens=args.die_after_tokens,
        ),
    )
    return config, ignored


def visible_devices_error(tensor_parallel_size: int, visible: str | None) -> str | None:
    """Why vLLM would fail to see enough GPUs, or None (P21)."""
    if visible is None:
        return None
    devices = [d for d in visible.split(",") if d.strip()]
    if len(devices) < tensor_parallel_size:
        return (
            f"CUDA_VISIBLE_DEVICES={visible!r} exposes {len(devices)} GPU(s) but "
            f"--tensor-parallel-size is {tensor_parallel_size}"
        )
    return None


async def _serve(config: SimEngineConfig) -> int:
    handle = await start_engine(config)
    for line in startup_lines(handle.engine.parts, os.getpid()):  # vLLM's memory lines
        print(line, flush=True)
    print(f"fake vllm: serving {config.model!r} on {handle.url}", flush=True)
    crashed = asyncio.ensure_future(handle.crashed.wait())
    died = asyncio.ensure_future(handle.died.wait())
    await asyncio.wait([crashed, died], return_when=asyncio.FIRST_COMPLETED)
    crashed.cancel()
    died.cancel()
    if not handle.crashed.is_set():  # vLLM: /health 503 a moment, then exit code 0
        print("fake vllm: simulated engine death (EngineCore encountered an issue)",
              flush=True)
        await asyncio.sleep(ENGINE_DEATH_EXIT_S)
        await handle.stop()
        return 0
    print("fake vllm: simulated crash", flush=True)
    await handle.stop()
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    config, ignored = parse_serve_args(sys.argv[1:] if argv is None else argv)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    print(
        f"fake vllm: CUDA_VISIBLE_DEVICES={visible} "
        f"CUDA_DEVICE_ORDER={os.environ.get('CUDA_DEVICE_ORDER')} "
        f"ignored={' '.join(ignored) or '-'}",
        flush=True,
    )
    why = visible_devices_error(config.tensor_parallel_size, visible)
    if why is not None:
        print(f"fake vllm: error: {why}", file=sys.stderr, flush=True)
        return 1
    try:
        return asyncio.run(_serve(config))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
