"""One process hosting N simulated engines: requests/s across them, and RSS.

    .venv/bin/python benchmarks/sim_many_engines.py [--engines 50] [--seconds 10]

Baseline in the same run: the same load against a single engine.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import time

import httpx

from inferplane.sim.config import SimEngineConfig
from inferplane.sim.host import start_engines, stop_engines


async def _load(urls: list[str], seconds: float, clients: int) -> int:
    done = 0
    deadline = time.monotonic() + seconds
    body = {"model": "m", "prompt": "hello world", "max_tokens": 16, "ignore_eos": True}

    async def client(i: int, http: httpx.AsyncClient) -> None:
        nonlocal done
        while time.monotonic() < deadline:
            url = urls[(i + done) % len(urls)]
            response = await http.post(url + "/v1/completions", json=body)
            response.raise_for_status()
            done += 1

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(timeout=30, limits=limits) as http:
        await asyncio.gather(*(client(i, http) for i in range(clients)))
    return done


async def run(engines: int, seconds: float, clients: int) -> tuple[float, float]:
    configs = [SimEngineConfig(model="m", max_model_len=2048) for _ in range(engines)]
    handles = await start_engines(configs)
    try:
        async with httpx.AsyncClient() as http:
            for h in handles:
                assert (await http.get(h.url + "/health")).status_code == 200
        done = await _load([h.url for h in handles], seconds, clients)
    finally:
        await stop_engines(handles)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return done / seconds, rss_mib


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engines", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=100)
    args = parser.parse_args()
    base_rps, base_rss = asyncio.run(run(1, args.seconds, args.clients))
    rps, rss = asyncio.run(run(args.engines, args.seconds, args.clients))
    print(f"{'engines':>8} {'req/s':>8} {'peak RSS MiB':>13}")
    print(f"{1:>8} {base_rps:8.1f} {base_rss:13.1f}")
    print(f"{args.engines:>8} {rps:8.1f} {rss:13.1f}")
    print(f"ratio {args.engines} engines / 1 engine req/s: {rps / base_rps:.2f}")


if __name__ == "__main__":
    main()
