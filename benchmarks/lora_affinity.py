"""LoRA adapter affinity in the gateway: loads on demand and TTFT, affinity vs random routing
and vs the least-outstanding balancer.

    .venv/bin/python benchmarks/lora_affinity.py [--requests 480] [--clients 16]
        [--replicas 4] [--adapters 8] [--max-loras 2] [--max-cpu-loras 2] [--load-time-s 0.2]

Four simulated engines of one base (vLLM's LoRA flags, run-time loading on, no adapter
loaded at start), eight adapters, a gateway in front. The same seeded stream of streaming
chat requests (each names one adapter, uniformly) runs three times, each time on fresh
engines:

- affinity: the gateway prefers replicas that hold the adapter, most those that served
  it lately (within their `max_cpu_loras` host cache), loading it elsewhere only on spill;
- random (the issue's baseline): every request to a replica drawn uniformly (seeded), the
  gateway still loading the adapter there on demand;
- least-outstanding: that scorer alone, ties rotating, which is how any model's requests
  are balanced without affinity; every replica ends up loading every adapter.

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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn

from inferplane.gateway import GatewayConfig, ModelRoute, build_app
from inferplane.gateway.backend import Backend
from inferplane.gateway.lora import AdapterRoute
from inferplane.gateway.scorers import RouteContext
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


class RandomScorer:
    """Random routing: a fresh uniform score per candidate (the gateway has no random
    policy; this replaces the pool's scorer chain in the baseline run only)."""

    weight = 1.0

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def score(self, candidates: Sequence[Backend], ctx: RouteContext) -> list[float]:
        return [self.rng.random() for _ in candidates]


ROUTINGS = ("affinity", "random", "least-outstanding")


async def run(args: argparse.Namespace, paths: list[str], routing: str) -> Result:
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
        adapter_affinity=routing == "affinity", adapter_cache_slots=args.max_cpu_loras,
    ),), access_log=False)
    app = build_app(config)
    if routing == "random":
        app.state.pools["base"].scorers = [RandomScorer(args.seed)]
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
        results = {routing: asyncio.run(run(args, paths, routing)) for routing in ROUTINGS}
    on, rnd, lo = (results[r] for r in ROUTINGS)
    print(f"{args.replicas} replicas, {args.adapters} adapters, max_loras {args.max_loras}, "
          f"max_cpu_loras {args.max_cpu_loras}, adapter read {args.load_time_s:g} s, "
          f"{args.requests} streaming requests from {args.clients} clients")
    print(f"{'':<24}{'affinity':>10}{'random':>10}{'least-out':>11}"
          f"{'random/aff':>12}{'least/aff':>11}")
    rows: list[tuple[str, list[float]]] = [
        ("loads on demand", [r.gateway_loads for r in (on, rnd, lo)]),
        ("adapter reads (engine)", [r.disk_reads for r in (on, rnd, lo)]),
        ("TTFT mean ms", [statistics.fmean(r.ttft_s) * 1e3 for r in (on, rnd, lo)]),
        ("TTFT p50 ms", [_pct(r.ttft_s, 0.5) * 1e3 for r in (on, rnd, lo)]),
        ("TTFT p90 ms", [_pct(r.ttft_s, 0.9) * 1e3 for r in (on, rnd, lo)]),
        ("TTFT p99 ms", [_pct(r.ttft_s, 0.99) * 1e3 for r in (on, rnd, lo)]),
        ("wall s", [r.wall_s for r in (on, rnd, lo)]),
        ("errors", [r.errors for r in (on, rnd, lo)]),
    ]
    for label, (a, b, c) in rows:
        ratios = "".join(f"{x / a:>11.2f}x" if a else f"{'-':>12}" for x in (b, c))
        print(f"{label:<24}{a:>10.1f}{b:>10.1f}{c:>11.1f}{ratios}")


if __name__ == "__main__":
    main()
