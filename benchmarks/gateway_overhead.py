"""Gateway overhead: stub engine directly vs through inferplane's gateway vs through nginx.

Drives the shared proxy harness (`../shared/bench/gateway`, see its README): a fast Node
stub imitating vLLM, wrk for non-streaming load at concurrency 1/32/256 and a Node load
generator for streaming at 32, the proxy under test pinned to CPU 0 and stub + load
generator to CPU 1. All targets run in the same invocation, alternated per round, so the
ratios compare like with like on a noisy machine.

Two gateway rows: "gateway (no tenancy)" (`--no-tenancy`) and "gateway + auth + limits":
tenancy on, an API key created in a fresh SQLite store with RPM/TPM/concurrency limits far
too high to trigger, the in-memory limiter, the usage ledger and x-ratelimit-* headers per
`--ratelimit-headers` (default on 429s only, as the gateway's); the load generators send
that key. "vs gw" is the tenancy row's RPS over the bare gateway's (issue 7: >= 0.90).

    python benchmarks/gateway_overhead.py                  # 2 rounds x 5 s per scenario
    python benchmarks/gateway_overhead.py --duration 10 --rounds 3
    python benchmarks/gateway_overhead.py --no-access-log  # the gateway without its log line
    python benchmarks/gateway_overhead.py --no-tenancy-row  # skip the auth + limits row
    python benchmarks/gateway_overhead.py --ratelimit-headers always  # x-ratelimit-* on all

Needs: node, wrk and nginx (installed with apt-get when missing and running as root).
Prints a table: RPS, p50/p99, added p50/p99 versus direct, RPS ratios versus direct and nginx.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_HARNESS = REPO.parent / "shared" / "bench" / "gateway"
TARGET = "inferplane"
TARGET_PORT = 8204
TENANCY_TARGET = "inferplane-tenancy"
TENANCY_PORT = 8205
LABELS = {
    "direct": "direct",
    "nginx": "nginx",
    TARGET: "gateway (no tenancy)",
    TENANCY_TARGET: "gateway + auth + limits",
}
# Limits on the benchmark key: all enforced on every request, none ever reached.
BENCH_RPM = 10**9
BENCH_TPM = 10**12
BENCH_CONCURRENCY = 10**6


def ensure_tools() -> None:
    missing = [tool for tool in ("wrk", "nginx") if shutil.which(tool) is None]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        sys.exit(f"missing {missing}; install them (apt-get install wrk nginx-light)")
    packages = ["wrk" if tool == "wrk" else "nginx-light" for tool in missing]
    subprocess.run(["apt-get", "install", "-y", *packages], check=True)


async def _create_key(db_url: str) -> str:
    """A fresh store holding one key with limits that are checked but never reached."""
    from inferplane.store import Store
    from inferplane.tenancy.keys import create_key

    store = await Store.open(db_url)
    try:
        _, secret = await create_key(
            store, "gateway-bench", rpm=BENCH_RPM, tpm=BENCH_TPM, max_concurrent=BENCH_CONCURRENCY
        )
    finally:
        await store.close()
    return secret


def run_harness(harness: Path, args: argparse.Namespace, out_dir: Path) -> Path:
    flags = "" if args.access_log else " --no-access-log"
    base = (
        f"{sys.executable} -m inferplane gateway --backend $BENCH_MODEL=$STUB_URL "
        f"--host 127.0.0.1 --port $PORT{flags}"
    )
    env = {
        **os.environ,
        "DURATION": str(args.duration),
        "ROUNDS": str(args.rounds),
        "OUT_DIR": str(out_dir),
        "PYTHONPATH": str(REPO),
    }
    # The tenancy row: limits in the gateway's memory, its own store; nothing from the caller.
    for name in ("INFERPLANE_REDIS_URL", "INFERPLANE_DATABASE_URL"):
        env.pop(name, None)
    only = ["direct", "nginx", TARGET]
    targets = ["--target", f"{TARGET}|{TARGET_PORT}|{base} --no-tenancy"]
    if args.tenancy_row:
        db_url = f"sqlite:///{out_dir / 'tenancy.db'}"
        env["BENCH_API_KEY"] = asyncio.run(_create_key(db_url))
        only.append(TENANCY_TARGET)
        tenancy = f"--tenancy --db {db_url} --ratelimit-headers {args.ratelimit_headers}"
        targets += ["--target", f"{TENANCY_TARGET}|{TENANCY_PORT}|{base} {tenancy}"]
    subprocess.run(
        ["bash", "run_all.sh", "--only", ",".join(only), *targets],
        cwd=harness,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL if not args.verbose else None,
    )
    raws = sorted(out_dir.glob("*.jsonl"))
    if not raws:
        sys.exit("the harness wrote no results")
    return raws[-1]


def summarize(raw: Path) -> dict[tuple[str, int, str], dict[str, float]]:
    """(mode, concurrency, target) -> median rps, p50_ms, p99_ms, errors over rounds."""
    runs: dict[tuple[str, int, str], list[dict[str, float]]] = {}
    for line in raw.read_text().splitlines():
        row = json.loads(line)
        data = row["data"]
        if row["mode"] == "ns":
            seconds = data["duration_us"] / 1e6
            errors = sum(data[k] for k in data if k.startswith("err_"))
            point = {
                "rps": data["requests"] / seconds,
                "p50_ms": data["lat_p50_us"] / 1000,
                "p99_ms": data["lat_p99_us"] / 1000,
                "errors": errors,
            }
        else:
            point = {
                "rps": data["rps"],
                "p50_ms": data["lat_p50_ms"],
                "p99_ms": data["lat_p99_ms"],
                "errors": data.get("errors", 0),
            }
        runs.setdefault((row["mode"], row["conc"], row["target"]), []).append(point)
    return {
        key: {k: statistics.median(p[k] for p in points) for k in points[0]}
        for key, points in runs.items()
    }


def render(table: dict[tuple[str, int, str], dict[str, float]]) -> str:
    header = (
        f"{'scenario':<18}{'target':<25}{'RPS':>9}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'+p50 ms':>9}{'+p99 ms':>9}{'vs direct':>11}{'vs nginx':>10}{'vs gw':>8}"
        f"{'errors':>8}"
    )
    lines = [header, "-" * len(header)]
    scenarios = sorted(
        {(mode, conc) for mode, conc, _ in table}, key=lambda s: (s[0] != "ns", s[1])
    )
    for mode, conc in scenarios:
        base = table.get((mode, conc, "direct"))
        nginx = table.get((mode, conc, "nginx"))
        bare = table.get((mode, conc, TARGET))
        name = f"{'non-stream' if mode == 'ns' else 'stream'} c={conc}"
        for target in ("direct", "nginx", TARGET, TENANCY_TARGET):
            row = table.get((mode, conc, target))
            if row is None:
                continue
            added50 = row["p50_ms"] - base["p50_ms"] if base else float("nan")
            added99 = row["p99_ms"] - base["p99_ms"] if base else float("nan")
            vs_direct = row["rps"] / base["rps"] if base else float("nan")
            vs_nginx = row["rps"] / nginx["rps"] if nginx else float("nan")
            vs_gw = f"{row['rps'] / bare['rps']:.3f}" if bare and target == TENANCY_TARGET else "-"
            lines.append(
                f"{name:<18}{LABELS[target]:<25}{row['rps']:>9,.0f}{row['p50_ms']:>9.2f}"
                f"{row['p99_ms']:>9.2f}{added50:>+9.2f}{added99:>+9.2f}{vs_direct:>11.3f}"
                f"{vs_nginx:>10.3f}{vs_gw:>8}{row['errors']:>8.0f}"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--harness", type=Path, default=DEFAULT_HARNESS)
    parser.add_argument("--duration", type=int, default=5, help="seconds per load run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--tenancy-row",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure the gateway with auth + limits (a key in a fresh SQLite store)",
    )
    parser.add_argument(
        "--ratelimit-headers",
        choices=("always", "on_429"),
        default="on_429",
        help="the tenancy row's x-ratelimit-* mode (gateway.ratelimit_headers)",
    )
    parser.add_argument("--verbose", action="store_true", help="show the harness's progress")
    args = parser.parse_args()
    if not (args.harness / "run_all.sh").exists():
        sys.exit(f"no harness at {args.harness}; pass --harness DIR (shared/bench/gateway)")
    if shutil.which("node") is None:
        sys.exit("the harness's stub and stream load generator need node")
    ensure_tools()
    with tempfile.TemporaryDirectory(prefix="gw-overhead-") as tmp:
        raw = run_harness(args.harness, args, Path(tmp))
        print(render(summarize(raw)))


if __name__ == "__main__":
    main()
