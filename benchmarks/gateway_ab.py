"""The gateway at a git ref vs the working tree, as a paired A/B on one CPU at the same time.

Both gateways (A: `--ref`, exported with `git archive` into a temporary folder; B: this
checkout) are pinned to CPU 0 and loaded at the same time by two `wrk` processes on CPU 1,
against the shared harness's Node stub engine. Noise from the machine hits both equally,
so the RPS ratio B / A is stable to a few percent between rounds where sequential runs on
a shared VM swing by ±15%. This is how each hot-path step of issue 29 was measured.
One such round (`paired_round`) is also what `gateway_vs_peers.py --paired` runs for the
gateway against nginx and the vLLM router (`benchmarks/peers_paired.py`).

    python benchmarks/gateway_ab.py --ref HEAD~1 [--tenancy] [--rounds 3] [--duration 8]
                                    [--concurrency 32] [--stream]
    python benchmarks/gateway_ab.py --ref HEAD --control   # the method's own bias (~1.00)
    # streams paced by the stub (one read per event): the CPU per request is the measure
    STUB_DELAY_MS=1 python benchmarks/gateway_ab.py --ref HEAD --stream --tenancy
    # limits in Redis (B: leased credit; INFERPLANE_REDIS_SYNC_S=0 for exact) vs memory (A):
    python benchmarks/gateway_ab.py --ref HEAD --control --tenancy --env-b \
        "INFERPLANE_REDIS_URL=redis://127.0.0.1:6379/0"
    # tracing with sample_ratio 0 (B) vs tracing off (A), same code:
    python benchmarks/gateway_ab.py --ref HEAD --control --env-b \
        "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:9 OTEL_TRACES_SAMPLER_ARG=0"

Tenancy: a key with RPM/TPM/concurrency limits far too high to trigger, in-memory
limiter, each gateway its own fresh SQLite usage ledger. Needs node and wrk (see
benchmarks/gateway_overhead.py); `--stream` uses the harness's Node stream load generator.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from gateway_overhead import REPO, _create_key, ensure_tools
from profile_gateway import HARNESS, free_port, pinned, stop, wait_ready


def export_ref(ref: str, into: Path) -> Path:
    """The tree of `ref` as plain files (its own `inferplane` package on PYTHONPATH)."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True,
                             capture_output=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def boost(pid: int, nice: int) -> None:
    """Weight the process's session against every other on the machine (autogroup nice:
    the scheduler shares a CPU between sessions, so a plain `nice` would not do it)."""
    if nice:
        try:
            Path(f"/proc/{pid}/autogroup").write_text(str(nice))
        except OSError as exc:  # no autogroups, or not allowed to go below 0
            print(f"autogroup nice {nice} for {pid}: {exc}", file=sys.stderr)


def load(harness: Path, port: int, key: str, seconds: int, conc: int,
         stream: bool, nice: int = 0) -> subprocess.Popen[str]:  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "BENCH_API_KEY": key, "BENCH_MODEL": "stub-model"}
    if stream:
        argv = ["node", "loadgen/stream_load.js", "--url", url + "/v1/chat/completions",
                "--concurrency", str(conc), "--duration", str(seconds),
                "--stream", "1"]  # fmt: skip
    else:
        argv = ["wrk", "-t1", f"-c{conc}", f"-d{seconds}s", "--timeout", "10s", "-s",
                "loadgen/chat.lua", url + "/v1/chat/completions"]  # fmt: skip
    proc = subprocess.Popen(["taskset", "-c", "1", *argv], cwd=harness, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=bool(nice))  # fmt: skip
    boost(proc.pid, nice)
    return proc


def rps(proc: subprocess.Popen[str], seconds: int) -> float:
    return measure(proc, seconds)[0]


def measure(proc: subprocess.Popen[str], seconds: int) -> tuple[float, float, float]:
    """RPS and the p50 and p99 latency in ms (NaN where the load generator gives none)."""
    out, _ = proc.communicate(timeout=seconds + 60)
    m = re.search(r'WRKJSON .*"requests":(\d+),"duration_us":(\d+).*"err_status":(\d+)'
                  r'.*"lat_p50_us":(\d+).*"lat_p99_us":(\d+)', out)  # fmt: skip
    if m is not None:
        if int(m.group(3)):
            sys.exit(f"wrk saw {m.group(3)} non-2xx answers")
        return (int(m.group(1)) / (int(m.group(2)) / 1e6), int(m.group(4)) / 1e3,
                int(m.group(5)) / 1e3)  # fmt: skip
    for line in out.splitlines():  # stream_load.js: one JSON summary line
        if line.startswith("STREAMJSON "):
            summary = json.loads(line.removeprefix("STREAMJSON "))
            if summary.get("errors") or summary.get("bad_streams"):
                sys.exit(f"stream load saw errors: {summary}")
            return (float(summary["rps"]), float(summary.get("lat_p50_ms", "nan")),
                    float(summary.get("lat_p99_ms", "nan")))  # fmt: skip
    sys.exit(f"the load generator printed no summary:\n{out[-2000:]}")


def cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) the process group has used (a target is started in its
    own session: nginx's worker and a shell's child count with their leader). With a paced
    stub (`STUB_DELAY_MS`) both sides serve the same RPS, and CPU per request is what differs."""
    ticks = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:  # gone between the listing and the read
            continue
        if int(fields[2]) == pgid:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def cpu_ticks() -> dict[int, tuple[int, int]]:
    """Per CPU: (busy, total) jiffies since boot, from /proc/stat."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *values = line.split()
        if name.startswith("cpu") and name[3:].isdigit():
            ticks = [int(v) for v in values[:8]]
            out[int(name[3:])] = (sum(ticks) - ticks[3] - ticks[4], sum(ticks))
    return out


@dataclass(frozen=True)
class Side:
    """One target of a pair: where to send load and the process group whose CPU it uses."""

    port: int
    key: str
    pgid: int


@dataclass(frozen=True)
class Sample:
    """One side of one paired round."""

    rps: float
    p50_ms: float
    p99_ms: float
    cpu_us: float  # CPU µs per request of the side's process group
    cpu_share: float  # CPU seconds used / seconds of the round (1.0 = one whole core)


def paired_round(harness: Path, sides: dict[str, Side], seconds: int, conc: int, stream: bool,
                 nice: int = 0) -> tuple[dict[str, Sample], dict[int, float]]:  # fmt: skip
    """Load every side at the same time (one load generator each, on CPU 1, its session at
    autogroup `nice`) for `seconds`: each side's sample and each CPU's busy fraction."""
    ticks0 = cpu_ticks()
    cpu0 = {n: cpu_s(side.pgid) for n, side in sides.items()}
    runs = {n: load(harness, side.port, side.key, seconds, conc, stream, nice)
            for n, side in sides.items()}  # fmt: skip
    got = {n: measure(proc, seconds) for n, proc in runs.items()}
    ticks1 = cpu_ticks()
    busy = {cpu: (ticks1[cpu][0] - b0) / max(1, ticks1[cpu][1] - t0)
            for cpu, (b0, t0) in ticks0.items()}  # fmt: skip
    samples = {}
    for n, side in sides.items():
        used = cpu_s(side.pgid) - cpu0[n]
        rps_n, p50, p99 = got[n]
        # CPU µs per request (the load's requests: RPS x duration)
        samples[n] = Sample(rps_n, p50, p99, used / (rps_n * seconds) * 1e6, used / seconds)
    return samples, busy


def _pairs(text: str) -> dict[str, str]:
    pairs = dict(item.split("=", 1) for item in text.split() if "=" in item)
    bad = [item for item in text.split() if "=" not in item]
    if bad:
        sys.exit(f"--env/--env-b: {bad[0]!r} is not K=V")
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", default="HEAD", help="git ref of gateway A (baseline)")
    parser.add_argument("--harness", type=Path, default=HARNESS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=int, default=8, help="seconds per round")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--tenancy", action="store_true", help="both gateways with tenancy")
    parser.add_argument("--stream", action="store_true", help="streaming requests")
    parser.add_argument("--control", action="store_true", help="B is the ref too")
    parser.add_argument("--gateway-args", default="", help="extra flags for both gateways")
    parser.add_argument("--env", default="", help="K=V ... for both gateways")
    parser.add_argument("--env-b", default="", help="K=V ... for gateway B only (after --env)")
    args = parser.parse_args()
    ensure_tools()
    with tempfile.TemporaryDirectory(prefix="gw-ab-") as tmp_s:
        tmp = Path(tmp_s)
        tree_a = export_ref(args.ref, tmp / "a")
        tree_b = tree_a if args.control else REPO
        stub_port = free_port()
        env = {**os.environ, "STUB_PORT": str(stub_port), "INFERPLANE_STATE_DIR": str(tmp)}
        for name in ("INFERPLANE_REDIS_URL", "INFERPLANE_DATABASE_URL"):
            env.pop(name, None)
        procs = [pinned(1, ["node", "stub/stub_server.js"], tmp / "stub.log", env,
                        args.harness)]  # fmt: skip
        ports = {"A": free_port(), "B": free_port()}
        keys = {"A": "sk-bench", "B": "sk-bench"}
        try:
            wait_ready(stub_port)
            for name, tree in (("A", tree_a), ("B", tree_b)):
                argv = [sys.executable, "-m", "inferplane", "gateway", "--host", "127.0.0.1",
                        "--port", str(ports[name]), "--backend",
                        f"stub-model=http://127.0.0.1:{stub_port}",
                        *args.gateway_args.split()]  # fmt: skip
                if args.tenancy:
                    db = f"sqlite:///{tmp / f'tenancy-{name}.db'}"
                    keys[name] = asyncio.run(_create_key(db))
                    argv += ["--tenancy", "--db", db]
                else:
                    argv += ["--no-tenancy"]
                genv = {**env, "PYTHONPATH": str(tree), **_pairs(args.env)}
                if name == "B":
                    genv.update(_pairs(args.env_b))
                procs.append(pinned(0, argv, tmp / f"gateway-{name}.log", genv, tree))
            for port in ports.values():
                wait_ready(port)
            for name, port in ports.items():  # warm-up, not recorded
                rps(load(args.harness, port, keys[name], 2, args.concurrency, args.stream), 2)
            ratios, p99s, cpus = [], [], []
            sides = {n: Side(ports[n], keys[n], procs[i].pid) for i, n in ((1, "A"), (2, "B"))}
            for r in range(1, args.rounds + 1):
                got, _ = paired_round(args.harness, sides, args.duration, args.concurrency,
                                      args.stream)  # fmt: skip
                cpus.append(got["B"].cpu_us / got["A"].cpu_us)
                ratios.append(got["B"].rps / got["A"].rps)
                p99s.append((got["A"].p99_ms, got["B"].p99_ms))
                print(f"round {r}: A ({args.ref}) {got['A'].rps:,.0f} RPS "
                      f"p50/p99 {got['A'].p50_ms:.2f}/{got['A'].p99_ms:.2f} ms, B "
                      f"({'control' if args.control else 'working tree'}) {got['B'].rps:,.0f} "
                      f"RPS p50/p99 {got['B'].p50_ms:.2f}/{got['B'].p99_ms:.2f} ms, B/A "
                      f"{ratios[-1]:.3f}; CPU µs/request A {got['A'].cpu_us:.0f}, B "
                      f"{got['B'].cpu_us:.0f}, B/A {cpus[-1]:.3f}", flush=True)  # fmt: skip
            ratios.sort()
            mode = ("stream" if args.stream else "non-stream") + f" c={args.concurrency}"
            mode += ", tenancy" if args.tenancy else ", bare"
            print(f"median B/A ({mode}): {ratios[len(ratios) // 2]:.3f}")
            print(f"median CPU per request B/A: {sorted(cpus)[len(cpus) // 2]:.3f}")
            mid = len(p99s) // 2
            print(f"median p99 ms: A {sorted(a for a, _ in p99s)[mid]:.2f}, "
                  f"B {sorted(b for _, b in p99s)[mid]:.2f}")  # fmt: skip
        finally:
            for proc in procs:
                stop(proc)


if __name__ == "__main__":
    main()
