"""LoRA adapter affinity in the gateway: loads on demand and TTFT, affinity on vs off.

    .venv/bin/python benchmarks/lora_affinity.py [--requests 480] [--clients 16]
        [--replicas 4] [--adapters 8] [--max-loras 2] [--max-cpu-loras 2] [--load-time-s 0.2]

Four simulated engines of one base (vLLM's LoRA flags, run-time loading on, no adapter
loaded at start), eight adapters, a gateway in front. The same seeded stream of streaming
chat requests (each names one adapter, uniformly) runs twice, each time on fresh engines:

- affinity on: the gateway prefers replicas that hold the adapter, most those that served
  it lately (within their `max_cpu_loras` host cache), loading it elsewhere only on spill;
- affinity off (the baseline): the least-outstanding scorer alone, ties rotating, which
  is how any model's requests are balanced; every replica ends up loading every adapter.

Reported per run: the gateway's loads on demand (POST /v1/load_lora_adapter), the engines'
adapter reads from disk (loads plus re-reads after their host cache evicted an adapter,
each costing `--load-time-s` before the request runs), and client-side TTFT. Ratios are
baseline / affinity. The engines run on the simulator's clock model; the numbers measure
routing, not a GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn

from inferplane.gateway import GatewayConfig, ModelRoute, build_app
from inferplane.gateway.lora import AdapterRoute
from inferplane.gateway.server import uvicorn_config
from inferplane.sim.config import SimEngineConfig
from inferplane.sim.host import start_engines, stop_engines
from inferplane.sim.lora import lora_config


@dataclass
class Result:
    gateway_loads: int
    disk_reads: int
    ttft_s: list[float]
    errors: int
    wall_s: float


def _adapters(root: Path, count: int) -> list[str]:
    paths = []
    for i in range(count):
        path = root / f"adapter-{i}"
        path.mkdir()
        (path / "adapter_config.json").write_text(json.dumps({"r": 16, "bias": "none"}))
        paths.append(str(path))
    return paths


async def _serve(app: object) -> tuple[uvicorn.Server, asyncio.Task[None], str]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn_config(app, "127.0.0.1", 0))
    server.config.loop = "none"
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    return server, task, f"http://127.0.0.1:{sock.getsockname()[1]}"


async def run(args: argparse.Namespace, paths: list[str], affinity: bool) -> Result:
    lora = lora_config(True, max_loras=args.max_loras, max_cpu_loras=args.max_cpu_loras,
                       load_time_s=args.load_time_s,
                       env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})
    handles = await start_engines([
        SimEngineConfig(model="base", max_model_len=4096, lora=lora, eos_after_tokens=32)
        for _ in range(args.replicas)
    ])
    adapters = tuple(AdapterRoute(f"adapter-{i}", "base", p) for i, p in enumerate(paths))
    config = GatewayConfig(models=(ModelRoute(
        "base", endpoints=tuple(h.url for h in handles), adapters=adapters,
        adapter_affinity=affinity, adapter_cache_slots=args.max_cpu_loras,
    ),), access_log=False)
    app = build_app(config)
    server, task, url = await _serve(app)
    rng = random.Random(args.seed)
    names = [rng.choice(adapters).name for _ in range(args.requests)]
    ttft: list[float] = []
    errors = 0
    queue: asyncio.Queue[str] = asyncio.Queue()
    for name in names:
        queue.put_nowait(name)

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal errors
        while not queue.empty():
            name = queue.get_nowait()
            body = {"model": name, "messages": [{"role": "user", "content": "hello " * 40}],
                    "max_tokens": 32, "stream": True}
            t0 = time.perf_counter()
            async with http.stream("POST", url + "/v1/chat/completions", json=body) as resp:
                first = None
                async for chunk in resp.aiter_bytes():
                    if first is None and b'"content"' in chunk:
                        first = time.perf_counter() - t0
                if resp.status_code != 200 or first is None:
                    errors += 1
                else:
                    ttft.append(first)

    t0 = time.perf_counter()
    try:
        async with httpx.AsyncClient(timeout=60) as http:
            await asyncio.gather(*(client(http) for _ in range(args.clients)))
        wall = time.perf_counter() - t0
        loads = app.adapters.loads
        reads = sum(h.engine.loras.disk_loads for h in handles)
    finally:
        server.should_exit = True
        await task
        await stop_engines(handles)
    return Result(loads, reads, ttft, errors, wall)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=480)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--max-loras", type=int, default=2)
    parser.add_argument("--max-cpu-loras", type=int, default=2)
    parser.add_argument("--load-time-s", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=27)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        paths = _adapters(Path(tmp), args.adapters)
        off = asyncio.run(run(args, paths, affinity=False))
        on = asyncio.run(run(args, paths, affinity=True))
    print(f"{args.replicas} replicas, {args.adapters} adapters, max_loras {args.max_loras}, "
          f"max_cpu_loras {args.max_cpu_loras}, adapter read {args.load_time_s:g} s, "
          f"{args.requests} streaming requests from {args.clients} clients")
    print(f"{'':<24}{'affinity off':>14}{'affinity on':>14}{'off / on':>10}")
    rows = [
        ("loads on demand", off.gateway_loads, on.gateway_loads),
        ("adapter reads (engine)", off.disk_reads, on.disk_reads),
        ("TTFT mean ms", statistics.fmean(off.ttft_s) * 1e3, statistics.fmean(on.ttft_s) * 1e3),
        ("TTFT p50 ms", _pct(off.ttft_s, 0.5) * 1e3, _pct(on.ttft_s, 0.5) * 1e3),
        ("TTFT p90 ms", _pct(off.ttft_s, 0.9) * 1e3, _pct(on.ttft_s, 0.9) * 1e3),
        ("TTFT p99 ms", _pct(off.ttft_s, 0.99) * 1e3, _pct(on.ttft_s, 0.99) * 1e3),
        ("wall s", off.wall_s, on.wall_s),
        ("errors", off.errors, on.errors),
    ]
    for label, a, b in rows:
        ratio = f"{a / b:.2f}x" if b else "-"
        print(f"{label:<24}{a:>14.1f}{b:>14.1f}{ratio:>10}")


if __name__ == "__main__":
    main()
