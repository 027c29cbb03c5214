"""Two gateways sharing one key's limits through Redis, loaded over their limit at once.

Both gateways use one SQLite store holding one key (`--rpm`, `--concurrency`) and one Redis
(`--redis`); the shared harness's Node stub answers; one `wrk` per gateway runs for
`--duration` seconds. Prints what both admitted together (200s) against what exact GCRA
allows in the run (rpm × (1 + T/60)) and the leased bound (rpm × (1 + (T + sync_s)/60),
docs/tenancy.md "Several gateways"), for each `--sync` value (0: the exact Redis limiter).

    python benchmarks/limits_shared.py --redis redis://127.0.0.1:6379/0 [--sync 0.5,0]
                                       [--rpm 600] [--concurrency 8] [--duration 10]

Needs node, wrk and a Redis server; the gateways run on CPU 0, stub and wrk on CPU 1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from profile_gateway import HARNESS, REPO, free_port, pinned, stop, wait_ready


async def shared_key(db_url: str, rpm: int, concurrency: int) -> str:
    from inferplane.store import Store
    from inferplane.tenancy.keys import create_key

    store = await Store.open(db_url)
    try:
        _, secret = await create_key(store, "shared", rpm=rpm, max_concurrent=concurrency)
    finally:
        await store.close()
    return secret


def wrk(args: argparse.Namespace, port: int, env: dict[str, str]) -> subprocess.Popen[str]:
    argv = ["taskset", "-c", "1", "wrk", "-t1", "-c16", f"-d{args.duration}s", "-s",
            "loadgen/chat.lua", f"http://127.0.0.1:{port}/v1/chat/completions"]  # fmt: skip
    return subprocess.Popen(argv, cwd=args.harness, env=env, stdout=subprocess.PIPE, text=True)


def one_run(args: argparse.Namespace, sync_s: float, tmp: Path) -> str:
    db = f"sqlite:///{tmp / f'shared-{sync_s}.db'}"
    secret = asyncio.run(shared_key(db, args.rpm, args.concurrency))
    stub_port = free_port()
    env = {**os.environ, "STUB_PORT": str(stub_port), "INFERPLANE_STATE_DIR": str(tmp),
           "PYTHONPATH": str(REPO), "INFERPLANE_REDIS_URL": args.redis,
           "INFERPLANE_REDIS_SYNC_S": str(sync_s)}  # fmt: skip
    env.pop("INFERPLANE_DATABASE_URL", None)
    procs = [pinned(1, ["node", "stub/stub_server.js"], tmp / "stub.log", env, args.harness)]
    ports = [free_port(), free_port()]
    try:
        wait_ready(stub_port)
        for i, port in enumerate(ports):
            argv = [sys.executable, "-m", "inferplane", "gateway", "--host", "127.0.0.1",
                    "--port", str(port), "--backend", f"stub-model=http://127.0.0.1:{stub_port}",
                    "--tenancy", "--db", db, "--no-access-log"]  # fmt: skip
            procs.append(pinned(0, argv, tmp / f"gateway-{i}.log", env, REPO))
        for port in ports:
            wait_ready(port)
        wrk_env = {**os.environ, "BENCH_API_KEY": secret, "BENCH_MODEL": "stub-model"}
        t0 = time.monotonic()
        loads = [wrk(args, port, wrk_env) for port in ports]
        outs = [load.communicate(timeout=args.duration + 60)[0] for load in loads]
        elapsed = time.monotonic() - t0
    finally:
        for proc in procs:
            stop(proc)
    admitted = refused = 0
    for out in outs:
        m = re.search(r'"requests":(\d+).*"err_status":(\d+)', out)
        if m is None:
            sys.exit(f"wrk printed no summary:\n{out[-2000:]}")
        admitted += int(m.group(1)) - int(m.group(2))
        refused += int(m.group(2))
    exact = args.rpm * (1 + elapsed / 60)
    bound = args.rpm * (1 + (elapsed + sync_s) / 60)
    mode = f"leased, sync_s {sync_s:g}" if sync_s else "exact"
    return (f"{mode:<22} {elapsed:5.1f} s  admitted {admitted:6,}  refused {refused:7,}  "
            f"exact allows {exact:7,.0f}  leased bound {bound:7,.0f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", required=True, help="Redis URL (a scratch server)")
    parser.add_argument("--sync", default="0.5,0", help="comma list of redis_sync_s values")
    parser.add_argument("--rpm", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--harness", type=Path, default=HARNESS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="limits-shared-") as tmp:
        for value in args.sync.split(","):
            print(one_run(args, float(value), Path(tmp)), flush=True)


if __name__ == "__main__":
    main()
