"""Gateway soak: every feature on, the harness's stub behind it, c=256 for N minutes; RSS flat?

Issue 5 asks for "no errors at c=256, and RSS flat over a 10-minute soak". This starts the
shared harness's Node stub (`../shared/bench/gateway/stub`) on 127.0.0.1, an inferplane
gateway in front of it from a fleet file that turns the features on (a weighted canary
route over two models, aliases, prefix and session affinity, a max_tokens cap, per-model
timeouts and queue, tenancy with an API key carrying RPM/TPM/concurrency limits in a fresh
SQLite store, the usage ledger, the JSON access log), and drives it with `wrk -c256`
(non-streaming, keep-alive, `loadgen/chat.lua`) for `--minutes`. Every `--sample-s`
seconds it reads the gateway process's RSS (/proc/PID/status) and scrapes `/metrics`.

    python benchmarks/gateway_soak.py                 # 10 minutes
    python benchmarks/gateway_soak.py --minutes 1     # a quick check

Pinning as in the harness: gateway on CPU 0, stub + wrk on CPU 1. Prints the RSS series,
first / last / max, the RSS growth over the second half of the run (after warm-up), the
request count, RPS, and wrk's error counters. Exit code 1 when any request failed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parents[1]
DEFAULT_HARNESS = REPO.parent / "shared" / "bench" / "gateway"
MODEL = "stub-model"  # the stub's name; also the canary route's client-facing name
MAX_MINUTES = 120.0
READY_POLLS = 120  # x 0.5 s

FLEET = """\
models:
  - name: {model}
    endpoints: ["{stub}"]
    aliases: ["stub-alias"]
    max_num_seqs: 512
    max_tokens_cap: {{limit: 64, action: clamp}}
    timeouts: {{connect_s: 5, first_byte_s: 60, idle_s: 30, total_s: 120}}
    routing: {{policy: prefix_affinity, max_queue_depth: 1024, max_queue_wait_s: 10}}
  - name: {model}-canary
    served_model_name: {model}
    endpoints: ["{stub}"]
    max_num_seqs: 512
    routing: {{policy: session_affinity}}
routes:
  - model: {model}
    backends: [{{target: {model}, weight: 90}}, {{target: {model}-canary, weight: 10}}]
gateway:
  host: 127.0.0.1
  port: {port}
  auth: "on"
"""


async def _create_key(db_url: str) -> str:
    from inferplane.store import Store
    from inferplane.tenancy.keys import create_key

    store = await Store.open(db_url)
    try:
        _, secret = await create_key(store, "soak", rpm=10**9, tpm=10**12, max_concurrent=10**6)
    finally:
        await store.close()
    return secret


def _rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _start(cmd: list[str], cpu: str, env: dict[str, str], stderr: int) -> subprocess.Popen[bytes]:
    """A process in its own session (stopped by its PID's group), pinned to `cpu`."""
    return subprocess.Popen(
        ["taskset", "-c", cpu, *cmd],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        start_new_session=True,
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


class _Tail:
    """Counts the gateway's stderr lines (one per request) and keeps the last few."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.lines = 0
        self.last: collections.deque[str] = collections.deque(maxlen=20)
        self._thread = threading.Thread(target=self._run, args=(stream,), daemon=True)
        self._thread.start()

    def _run(self, stream: IO[bytes]) -> None:
        for raw in stream:
            self.lines += 1
            self.last.append(raw.decode(errors="replace").rstrip())

    def join(self) -> None:
        self._thread.join(timeout=5)


def _post_ok(url: str, key: str) -> bool:
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    req = urllib.request.Request(
        url + "/v1/chat/completions",
        data=body.encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _scrape(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
            resp.read()
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--sample-s", type=float, default=10.0, help="RSS sampling interval")
    parser.add_argument("--port", type=int, default=8206, help="gateway port (127.0.0.1)")
    parser.add_argument("--stub-port", type=int, default=8110)
    parser.add_argument("--harness", type=Path, default=DEFAULT_HARNESS)
    args = parser.parse_args()
    if not 0 < args.minutes <= MAX_MINUTES:
        sys.exit(f"--minutes must be in (0, {MAX_MINUTES:g}]")
    if not args.sample_s >= 1:
        sys.exit("--sample-s must be at least 1")
    for tool in ("node", "wrk", "taskset"):
        if shutil.which(tool) is None:
            sys.exit(f"needs {tool} (apt-get install nodejs wrk util-linux)")
    if not (args.harness / "stub" / "stub_server.js").exists():
        sys.exit(f"no harness at {args.harness}; pass --harness DIR (shared/bench/gateway)")
    seconds = max(1, round(args.minutes * 60))
    stub_url = f"http://127.0.0.1:{args.stub_port}"
    gw_url = f"http://127.0.0.1:{args.port}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for name in ("INFERPLANE_REDIS_URL", "INFERPLANE_DATABASE_URL"):
        env.pop(name, None)

    with tempfile.TemporaryDirectory(prefix="gw-soak-") as tmp:
        fleet = Path(tmp) / "fleet.yaml"
        fleet.write_text(FLEET.format(model=MODEL, stub=stub_url, port=args.port))
        db_url = f"sqlite:///{Path(tmp) / 'soak.db'}"
        key = asyncio.run(_create_key(db_url))
        stub = _start(
            ["node", str(args.harness / "stub" / "stub_server.js"), "--port", str(args.stub_port)],
            "1",
            env,
            subprocess.DEVNULL,
        )
        gateway = _start(
            [sys.executable, "-m", "inferplane", "gateway", "--fleet", str(fleet),
             "--db", db_url, "--host", "127.0.0.1", "--port", str(args.port)],
            "0",
            env,
            subprocess.PIPE,
        )  # fmt: skip
        assert gateway.stderr is not None
        tail = _Tail(gateway.stderr)
        wrk: subprocess.Popen[bytes] | None = None
        try:
            for _ in range(READY_POLLS):
                if gateway.poll() is not None or _post_ok(gw_url, key):
                    break
                time.sleep(0.5)
            if gateway.poll() is not None or not _post_ok(gw_url, key):
                print("gateway did not get ready:\n" + "\n".join(tail.last), file=sys.stderr)
                return 1
            series: list[tuple[float, int]] = []
            scrape_failures = 0
            t0 = time.monotonic()
            rss = _rss_kib(gateway.pid)
            if rss is not None:
                series.append((0.0, rss))
            wrk = subprocess.Popen(
                ["taskset", "-c", "1", "wrk", "-t1", f"-c{args.concurrency}", f"-d{seconds}s",
                 "--timeout", "10s", "-s", str(args.harness / "loadgen" / "chat.lua"),
                 gw_url + "/v1/chat/completions"],
                env={**env, "BENCH_API_KEY": key, "BENCH_MODEL": MODEL},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            max_samples = int(seconds / args.sample_s) + 10
            for i in range(1, max_samples + 1):
                deadline = t0 + i * args.sample_s
                while wrk.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.2)
                if wrk.poll() is not None:
                    break
                rss = _rss_kib(gateway.pid)
                if rss is not None:
                    series.append((time.monotonic() - t0, rss))
                if not _scrape(gw_url):
                    scrape_failures += 1
                print(f"t={time.monotonic() - t0:6.0f}s rss={rss} KiB", flush=True)
            out, _ = wrk.communicate(timeout=seconds + 60)
            rss = _rss_kib(gateway.pid)
            if rss is not None:
                series.append((time.monotonic() - t0, rss))
            alive = gateway.poll() is None
        finally:
            if wrk is not None and wrk.poll() is None:
                os.killpg(wrk.pid, signal.SIGKILL)
                wrk.wait(timeout=10)
            _stop(gateway)
            _stop(stub)
            tail.join()

    text = out.decode(errors="replace")
    summary = next(
        (json.loads(line[8:]) for line in text.splitlines() if line.startswith("WRKJSON ")), None
    )
    if summary is None:
        print("wrk printed no summary:\n" + text, file=sys.stderr)
        return 1
    errors = {k: v for k, v in summary.items() if k.startswith("err_")}
    total = summary["requests"]
    rps = total / (summary["duration_us"] / 1e6)
    values = [kib for _, kib in series]
    half = [kib for t, kib in series if t >= seconds / 2]
    print("\nRSS series (s, MiB): " + ", ".join(f"{t:.0f}:{kib / 1024:.1f}" for t, kib in series))
    print(
        f"RSS MiB: first {values[0] / 1024:.1f}  last {values[-1] / 1024:.1f}  "
        f"max {max(values) / 1024:.1f}  second half {min(half) / 1024:.1f}..{max(half) / 1024:.1f}"
        if half
        else f"RSS MiB: first {values[0] / 1024:.1f}  last {values[-1] / 1024:.1f}"
    )
    print(
        f"requests {total}  RPS {rps:,.0f}  p50 {summary['lat_p50_us'] / 1000:.2f} ms  "
        f"p99 {summary['lat_p99_us'] / 1000:.2f} ms  max {summary['lat_max_us'] / 1000:.0f} ms"
    )
    print(f"errors {sum(errors.values())} {errors}  /metrics scrape failures {scrape_failures}")
    print(f"gateway stderr lines (access log) {tail.lines}; gateway alive at the end: {alive}")
    return 0 if alive and not sum(errors.values()) and not scrape_failures else 1


if __name__ == "__main__":
    sys.exit(main())
