"""Python bytecodes the gateway executes per request: bare vs tenancy, exact and noise-free.

On this project's small VMs, RPS ratios swing by ±15% between runs, but the gateway is
CPU-bound in the interpreter, so the bytecodes executed per request predict its RPS: the
paired RPS benchmark (`tenancy_pair.py`) read 0.87 where this one counted +13% bytecodes,
0.90-0.92 at +11% and 0.80-0.82 at +25%. Use it to see what a change to the hot path costs
before measuring RPS, and which functions the difference is in.

Each mode starts `inferplane gateway` in a child process with an opcode tracer on its main
thread (everything that thread runs is counted: request handling, ledger flushes, key
refreshes), sends `--warmup` untraced requests and then `--requests` traced ones (8 at a
time) through the shared harness's Node stub engine, and reads the counts back.

    python benchmarks/gateway_opcodes.py [--requests 1000] [--top 12]

Modes: the bare gateway (`--no-tenancy`), tenancy with an API key with RPM/TPM/concurrency
limits and x-ratelimit-* headers only on 429s (`on_429`) and on every response (`always`).
Counts are for the Python running the benchmark (bytecodes differ between versions).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_overhead import DEFAULT_HARNESS, REPO, _create_key
from tenancy_pair import _wait_ready

STUB_URL = "http://127.0.0.1:8100"
PORT = 8309
BODY = json.dumps(
    {"model": "stub-model", "messages": [{"role": "user", "content": "Say hi."}],
     "max_tokens": 16}
).encode()  # fmt: skip


def serve_traced(out: Path, warmup: int, gateway_args: list[str]) -> None:
    """In the child: run the gateway with an opcode tracer that starts after `warmup`
    requests; SIGUSR1 writes the counts to `out` and exits."""
    from inferplane.cli.main import main
    from inferplane.gateway.app import GatewayApp

    counts: collections.Counter[str] = collections.Counter()
    seen = {"requests": 0, "traced": 0}

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            counts[frame.f_code.co_qualname] += 1
        return tracer

    original = GatewayApp._proxy

    async def counted(self: GatewayApp, *args: Any) -> None:
        seen["requests"] += 1
        if seen["requests"] > warmup:
            seen["traced"] += 1
            if sys.gettrace() is None:
                sys.settrace(tracer)
        await original(self, *args)

    def dump(*_: object) -> None:
        sys.settrace(None)
        out.write_text(json.dumps({"requests": seen["traced"], "counts": counts}))
        os._exit(0)

    GatewayApp._proxy = counted  # type: ignore[method-assign,assignment]
    signal.signal(signal.SIGUSR1, dump)
    sys.argv = ["inferplane", "gateway", *gateway_args]
    main()


async def _load(n: int, key: str, concurrency: int = 8) -> None:
    import aiohttp

    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    url = f"http://127.0.0.1:{PORT}/v1/chat/completions"
    todo = iter(range(n))
    async with aiohttp.ClientSession(headers=headers) as session:

        async def worker() -> None:
            for _ in todo:
                async with session.post(url, data=BODY) as r:
                    await r.read()
                    if r.status != 200:
                        sys.exit(f"the gateway answered {r.status}: {await r.text()}")

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def measure(mode: str, args: argparse.Namespace, tmp: Path, key: str, db: str) -> dict[str, Any]:
    out = tmp / f"{mode}.json"
    gateway = ["--backend", f"stub-model={STUB_URL}", "--host", "127.0.0.1",
               "--port", str(PORT)]  # fmt: skip
    if mode == "bare":
        gateway.append("--no-tenancy")
    else:
        gateway += ["--tenancy", "--db", db, "--ratelimit-headers", mode]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for name in ("INFERPLANE_REDIS_URL", "INFERPLANE_DATABASE_URL"):
        env.pop(name, None)
    child = [sys.executable, __file__, "--serve", str(out), str(args.warmup), *gateway]
    with (tmp / f"{mode}.log").open("wb") as log:
        proc = subprocess.Popen(child, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_ready(PORT)
        asyncio.run(_load(args.warmup, key if mode != "bare" else "none"))
        time.sleep(1.5)  # one-time work (the ledger's first flush builds its SQL) is done
        asyncio.run(_load(args.requests, key if mode != "bare" else "none"))
        proc.send_signal(signal.SIGUSR1)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    return dict(json.loads(out.read_text()))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve_traced(Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--harness", type=Path, default=DEFAULT_HARNESS)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--top", type=int, default=12, help="functions to list per mode")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        db = f"sqlite:///{tmp / 'tenancy.db'}"
        key = asyncio.run(_create_key(db))
        stub = subprocess.Popen(["node", "stub/stub_server.js"], cwd=args.harness,
                                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            results = {m: measure(m, args, tmp, key, db) for m in ("bare", "on_429", "always")}
        finally:
            stub.terminate()
            stub.wait(timeout=10)
    per = {m: sum(r["counts"].values()) / r["requests"] for m, r in results.items()}
    print(f"Python {sys.version.split()[0]}, {args.requests} requests per mode, 8 concurrent")
    print(f"{'mode':<32} {'opcodes/request':>16} {'vs bare':>8}")
    labels = {"bare": "gateway (no tenancy)", "on_429": "+ key, limits, ledger (on_429)",
              "always": "+ x-ratelimit-* on every response"}  # fmt: skip
    for mode, value in per.items():
        print(f"{labels[mode]:<32} {value:>16,.0f} {value / per['bare']:>8.3f}")
    base = results["bare"]
    for mode in ("on_429", "always"):
        r = results[mode]
        delta = {
            name: r["counts"].get(name, 0) / r["requests"]
            - base["counts"].get(name, 0) / base["requests"]
            for name in set(r["counts"]) | set(base["counts"])
        }
        print(f"\nwhere {mode} adds its opcodes (per request, largest first):")
        for name, extra in sorted(delta.items(), key=lambda kv: -kv[1])[: args.top]:
            print(f"  {extra:+8.1f}  {name}")


if __name__ == "__main__":
    main()
