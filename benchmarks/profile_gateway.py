"""Where a non-streaming request's time goes in the gateway: py-spy samples under load.

Starts the shared harness's Node stub engine and the gateway (bare, or with tenancy: a key
with RPM/TPM/concurrency limits in memory, the SQLite usage ledger), pins the gateway to
CPU 0 and stub + wrk to CPU 1, loads it with wrk at `--concurrency` for `--seconds`, and
samples the gateway's process with py-spy (`record --format raw`, idle frames dropped).
Prints, per row: RPS, then the share of on-CPU samples per stage of the request's way
(inclusive), and the functions with the most self time. `--out DIR` keeps the raw stacks.

    python benchmarks/profile_gateway.py [--seconds 8] [--concurrency 32] [--rows bare,tenancy]
    python benchmarks/profile_gateway.py --rows tenancy,redis --redis redis://127.0.0.1:6379/0
    python benchmarks/profile_gateway.py --rows tenancy --stream   # SSE, 64 events a stream

Needs node, wrk and py-spy (`pip install 'inferplane[profile]'`; sampling another process
needs root or ptrace permission). The numbers are shares of one process's samples, never
wall-clock claims; RPS under py-spy is lower than without it (sampling costs CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from gateway_overhead import DEFAULT_HARNESS, REPO, _create_key

# The main checkout sits next to shared/; a worktree one level deeper.
HARNESS = next((p for p in (DEFAULT_HARNESS, REPO.parents[1] / "shared" / "bench" / "gateway")
                if p.exists()), DEFAULT_HARNESS)

# Stage -> frame pattern. A sample is charged to the stage of its innermost frame that
# matches one (leaf to root), so uvicorn's `send` under the relay counts as the server's
# socket write and tenancy's `record` under accounting as accounting.
STAGES: list[tuple[str, re.Pattern[str]]] = [
    ("tracing", re.compile(r"gateway/tracing\.py|opentelemetry")),
    ("server: uvicorn + httptools (socket I/O, ASGI)", re.compile(r"uvicorn/|httptools_impl")),
    ("account: metrics", re.compile(r"prometheus_client|gateway/metrics\.py")),
    ("account: access log", re.compile(r"gateway/accesslog\.py")),
    ("account: tenancy record (limits release, ledger row)", re.compile(
        r"^(Tenancy\.)?record \(|tenancy/ledger\.py|KeyState\.release|release_now")),
    ("limits: Redis (redis-py, leased sync)", re.compile(r"/redis/|_sync_key|sync_all")),
    ("account: usage, records", re.compile(
        r"_account|_tenancy_done|usage_from|gateway/account")),
    ("admit: tenancy (auth, limits)", re.compile(r"inferplane/tenancy/")),
    ("accept: headers, body, parse", re.compile(
        r"gateway/request\.py|gateway/names\.py|gateway/reserve\.py|_read_body|gateway/accept")),
    ("route: resolve, pick a replica", re.compile(
        r"gateway/pool\.py|gateway/scorers\.py|gateway/state\.py|gateway/routing")),
    ("forward + relay: upstream client", re.compile(
        r"gateway/upstream\.py|_forward|gateway/forward|_relay|gateway/relay|_respond")),
    ("gateway: the rest of the request path (app)", re.compile(r"inferplane/gateway/")),
    ("event loop (uvloop, asyncio: callbacks, timers, tasks)", re.compile(r".")),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(port: int, path: str = "/health", seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1)
            return
        except OSError:
            time.sleep(0.3)
    sys.exit(f"nothing answered on port {port}")


def pinned(cpu: int, argv: list[str], log: Path, env: dict[str, str],
           cwd: Path | None = None) -> subprocess.Popen[bytes]:  # fmt: skip
    return subprocess.Popen(["taskset", "-c", str(cpu), *argv], stdout=log.open("wb"),
                            stderr=subprocess.STDOUT, env=env, cwd=cwd,
                            start_new_session=True)  # fmt: skip


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)


def wrk(harness: Path, port: int, key: str, seconds: int, conc: int) -> float:
    env = {**os.environ, "BENCH_API_KEY": key, "BENCH_MODEL": "stub-model"}
    out = subprocess.run(
        ["taskset", "-c", "1", "wrk", "-t1", f"-c{conc}", f"-d{seconds}s", "--timeout", "10s",
         "-s", str(harness / "loadgen" / "chat.lua"),
         f"http://127.0.0.1:{port}/v1/chat/completions"],
        capture_output=True, text=True, env=env, timeout=seconds + 30, check=True,
    ).stdout  # fmt: skip
    m = re.search(r'WRKJSON .*"requests":(\d+),"duration_us":(\d+).*"err_status":(\d+)', out)
    if m is None:
        sys.exit(f"wrk printed no summary:\n{out}")
    if int(m.group(3)):
        sys.exit(f"wrk saw {m.group(3)} non-2xx answers")
    return int(m.group(1)) / (int(m.group(2)) / 1e6)


def stream_load(harness: Path, port: int, key: str, seconds: int, conc: int) -> float:
    """Streaming RPS from the harness's Node stream load generator (`--stream`)."""
    env = {**os.environ, "BENCH_API_KEY": key, "BENCH_MODEL": "stub-model"}
    out = subprocess.run(
        ["taskset", "-c", "1", "node", "loadgen/stream_load.js", "--url",
         f"http://127.0.0.1:{port}/v1/chat/completions", "--concurrency", str(conc),
         "--duration", str(seconds), "--stream", "1"],
        capture_output=True, text=True, env=env, timeout=seconds + 30, check=True,
        cwd=harness,
    ).stdout  # fmt: skip
    m = re.search(r'STREAMJSON .*"rps":([0-9.]+).*"errors":(\d+)', out)
    if m is None or int(m.group(2)):
        sys.exit(f"the stream load generator printed no clean summary:\n{out}")
    return float(m.group(1))


def _idle_thread_leaves() -> set[str]:
    """aiosqlite's worker waiting on its queue (`tx.get()`): py-spy samples it as running."""
    try:
        import aiosqlite.core as core
    except ImportError:
        return set()
    lines = Path(core.__file__).read_text().splitlines()
    return {f"_connection_worker_thread (aiosqlite/core.py:{i})"
            for i, text in enumerate(lines, 1) if "tx.get()" in text}  # fmt: skip


def _stage(frames: list[str]) -> str:
    if frames[-1].startswith(("Runner.run ", "run_until_complete ", "asyncio_run ")):
        return STAGES[-1][0]  # uvloop's own C code (callbacks, reads): no Python frame
    for frame in reversed(frames):
        for name, pattern in STAGES[:-1]:
            if pattern.search(frame):
                return name
    return STAGES[-1][0]


def summarize(raw: Path, top: int) -> str:
    """Stage shares (inclusive) and top self-time functions from py-spy's collapsed stacks."""
    stages: collections.Counter[str] = collections.Counter()
    self_time: collections.Counter[str] = collections.Counter()
    total = 0
    idle_leaves = _idle_thread_leaves()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        leaf = frames[-1]
        if leaf.startswith(("select (", "poll (", "epoll_wait", "run_forever")) or (
            "_run_once" in leaf and "base_events" in leaf
        ) or leaf in idle_leaves:
            continue  # idle in the event loop or a worker thread: not the request's cost
        total += n
        stages[_stage(frames)] += n
        self_time[re.sub(r":\d+\)$", ")", leaf)] += n
    if not total:
        return "  (no on-CPU samples)\n"
    lines = [f"  on-CPU samples: {total}",
             "  stage (each sample charged to its innermost matching frame):"]
    for name, _ in STAGES:
        if stages[name]:
            lines.append(f"    {stages[name] / total:6.1%}  {name}")
    lines.append(f"  top {top} functions by self time:")
    for name, n in self_time.most_common(top):
        lines.append(f"    {n / total:6.1%}  {name}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--harness", type=Path, default=HARNESS)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rows", default="bare,tenancy",
                        help="comma list: bare, tenancy, redis (tenancy, limits in --redis)")
    parser.add_argument("--redis", default="", help="Redis URL for the redis row")
    parser.add_argument("--rate", type=int, default=500, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--stream", action="store_true", help="streaming requests (Node)")
    parser.add_argument("--out", type=Path, default=None, help="keep raw stacks here")
    parser.add_argument("--gateway-args", default="", help="extra `inferplane gateway` flags")
    args = parser.parse_args()
    for tool in ("node", "wrk", "py-spy", "taskset"):
        if shutil.which(tool) is None and not (tool == "py-spy" and _py_spy()):
            sys.exit(f"{tool} is needed (py-spy: pip install py-spy; wrk: apt-get install wrk)")
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    with tempfile.TemporaryDirectory(prefix="gw-profile-") as tmp_s:
        tmp = Path(tmp_s)
        out = args.out or tmp
        out.mkdir(parents=True, exist_ok=True)
        stub_port = free_port()
        env = {**os.environ, "STUB_PORT": str(stub_port), "INFERPLANE_STATE_DIR": str(tmp),
               "PYTHONPATH": str(REPO)}
        for name in ("INFERPLANE_REDIS_URL", "INFERPLANE_DATABASE_URL"):
            env.pop(name, None)
        stub = pinned(1, ["node", "stub/stub_server.js"], tmp / "stub.log", env, args.harness)
        try:
            wait_ready(stub_port)
            print(f"profile: wrk -t1 -c{args.concurrency} -d{args.seconds}s, py-spy "
                  f"{args.rate}/s; gateway on CPU 0, stub + wrk on CPU 1\n")  # fmt: skip
            for row in rows:
                print(f"== {row} ==")
                print(profile_row(row, args, env, tmp, out, stub_port), end="")
        finally:
            stop(stub)


def _py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return found if Path(found).exists() else ""


def profile_row(row: str, args: argparse.Namespace, env: dict[str, str], tmp: Path,
                out: Path, stub_port: int) -> str:  # fmt: skip
    port = free_port()
    argv = [sys.executable, "-m", "inferplane", "gateway", "--host", "127.0.0.1",
            "--port", str(port), "--backend", f"stub-model=http://127.0.0.1:{stub_port}",
            *args.gateway_args.split()]  # fmt: skip
    key = "sk-bench"
    if row in ("tenancy", "redis"):
        db = f"sqlite:///{tmp / f'{row}.db'}"
        key = asyncio.run(_create_key(db))
        argv += ["--tenancy", "--db", db]
        if row == "redis":  # the same key's limits in Redis (leased credit unless told)
            if not args.redis:
                sys.exit("--rows redis needs --redis URL")
            env = {**env, "INFERPLANE_REDIS_URL": args.redis}
    elif row == "bare":
        argv += ["--no-tenancy"]
    else:
        sys.exit(f"--rows: unknown row {row!r}; use bare, tenancy, redis")
    gw = pinned(0, argv, tmp / f"gateway-{row}.log", env)
    try:
        wait_ready(port)
        load = stream_load if args.stream else wrk
        load(args.harness, port, key, 2, args.concurrency)  # warm-up, not sampled
        raw = out / f"profile-{row}.txt"
        spy = subprocess.Popen(
            [_py_spy(), "record", "--pid", str(gw.pid), "--rate", str(args.rate), "--format",
             "raw", "--duration", str(args.seconds), "--nonblocking", "-o", str(raw)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(0.5)
        rps = load(args.harness, port, key, args.seconds, args.concurrency)
        spy.wait(args.seconds + 30)
    finally:
        stop(gw)
    return f"  RPS under py-spy: {rps:,.0f}\n" + summarize(raw, args.top)


if __name__ == "__main__":
    main()
