"""Tenancy's cost as a paired A/B: two gateways share one CPU at the same time.

The bare gateway (`--no-tenancy`) and the tenancy gateway (a key with RPM/TPM/concurrency
limits, in-memory limiter, SQLite usage ledger, x-ratelimit-* headers as
`--ratelimit-headers` says, by default on 429s only like the gateway's) are both pinned to
CPU 0 and loaded at the same time by two `wrk` processes on CPU 1 (with the shared
harness's Node stub engine).
Noise from the machine hits both equally, so the RPS ratio tenancy / bare is stable to
about ±1% between rounds, where `gateway_overhead.py`'s sequential runs swing by ±15% on a
shared VM. The same script with `--control` runs two bare gateways: the method's own bias
(expect 0.99-1.01).

    python benchmarks/tenancy_pair.py [--rounds 3] [--duration 10] [--concurrency 32]
                                      [--ratelimit-headers on_429|always] [--control]

Needs node and wrk (see benchmarks/gateway_overhead.py).
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
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_overhead import DEFAULT_HARNESS, REPO, _create_key, ensure_tools

STUB_URL = "http://127.0.0.1:8100"
PORTS = {"bare": 8305, "tenancy": 8306}


def _pinned(
    cpu: int, argv: list[str], log: Path, env: dict[str, str], cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["taskset", "-c", str(cpu), *argv], stdout=log.open("wb"),
                            stderr=subprocess.STDOUT, env=env, cwd=cwd,
                            start_new_session=True)  # fmt: skip


def _wait_ready(port: int, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return
        except OSError:
            time.sleep(0.3)
    sys.exit(f"nothing answered on port {port}")


def _wrk(harness: Path, port: int, key: str, seconds: int, conc: int) -> subprocess.Popen[str]:
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    env = {**os.environ, "BENCH_API_KEY": key, "BENCH_MODEL": "stub-model"}
    return subprocess.Popen(
        ["taskset", "-c", "1", "wrk", "-t1", f"-c{conc}", f"-d{seconds}s", "-s",
         "loadgen/chat.lua", url],
        cwd=harness, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def _rps(proc: subprocess.Popen[str]) -> float:
    out, _ = proc.communicate()
    match = re.search(r"Requests/sec:\s*([\d.]+)", out)
    if match is None:
        sys.exit(f"wrk printed no rate:\n{out}")
    return float(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--harness", type=Path, default=DEFAULT_HARNESS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=int, default=10, help="seconds per round")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--control", action="store_true", help="two bare gateways")
    parser.add_argument("--ratelimit-headers", choices=("always", "on_429"), default="on_429",
                        help="the tenancy gateway's x-ratelimit-* mode")  # fmt: skip
    args = parser.parse_args()
    ensure_tools()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        db = f"sqlite:///{tmp / 'tenancy.db'}"
        key = asyncio.run(_create_key(db))
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        for name in ("INFERPLANE_REDIS_URL", "INFERPLANE_DATABASE_URL"):
            env.pop(name, None)
        base = [sys.executable, "-m", "inferplane", "gateway", "--backend",
                f"stub-model={STUB_URL}", "--host", "127.0.0.1"]  # fmt: skip
        tenancy = ["--tenancy", "--db", db, "--ratelimit-headers", args.ratelimit_headers]
        if args.control:
            tenancy = ["--no-tenancy"]
        procs = [
            _pinned(1, ["node", "stub/stub_server.js"], tmp / "stub.log", env, args.harness),
            _pinned(0, [*base, "--port", str(PORTS["bare"]), "--no-tenancy"],
                    tmp / "bare.log", env),
            _pinned(0, [*base, "--port", str(PORTS["tenancy"]), *tenancy],
                    tmp / "tenancy.log", env),
        ]  # fmt: skip
        try:
            for port in PORTS.values():
                _wait_ready(port)
            keys = {"bare": "none", "tenancy": key}
            for name, port in PORTS.items():  # warm-up, not recorded
                _rps(_wrk(args.harness, port, keys[name], 3, args.concurrency))
            ratios = []
            label = "bare #2" if args.control else "tenancy"
            for r in range(1, args.rounds + 1):
                runs = {n: _wrk(args.harness, p, keys[n], args.duration, args.concurrency)
                        for n, p in PORTS.items()}  # fmt: skip
                rps = {n: _rps(proc) for n, proc in runs.items()}
                ratios.append(rps["tenancy"] / rps["bare"])
                print(f"round {r}: bare {rps['bare']:,.0f} RPS, {label} {rps['tenancy']:,.0f} "
                      f"RPS, ratio {ratios[-1]:.3f}", flush=True)  # fmt: skip
            ratios.sort()
            print(f"median ratio {label} / bare at c={args.concurrency}: "
                  f"{ratios[len(ratios) // 2]:.3f}")  # fmt: skip
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(timeout=10)


if __name__ == "__main__":
    main()
