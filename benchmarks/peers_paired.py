"""`gateway_vs_peers.py --paired`: the gateway and a peer (nginx, the vLLM router) on one CPU
at the same time, so the machine's noise hits both and the per-round ratio stays put.

Why: on this shared 2-core VM the sequential run (one target after another) swings ±30%
between rounds of the same code (`benchmarks/profiles/gateway-vs-peers-run8.txt`:
gw-base-tenancy and gw-tenancy are the same code, 2848 vs 2010 RPS streaming). Paired, a
slow second slows both sides, and the ratio is what is left: `gateway_ab.py`'s method,
with its launch, pinning and load generators (`paired_round`), applied to peers.

What runs: the harness's Node stub on CPU 1; nginx (`targets/nginx.sh`: one worker,
keep-alive upstream, as in the sequential run), the vLLM router (`targets/vllm_router.sh`),
this checkout's gateway bare and with tenancy (`gateway_vs_peers.targets`), each pinned to
CPU 0 in its own session, all started once. Per round and scenario (non-streaming
c=1/32/256 with wrk, streaming c=32 with the stream load generator) every pair is loaded at
once, one load generator per side on CPU 1, for `--duration` s: gw and gw-tenancy against
nginx and against the router, and the controls nginx vs a second nginx, router vs a second
router, gw vs a second gw. A control's spread is the method's own error; its median
off 1.0 is its bias (who starts first alternates per round, the pair order rotates).
Printed per pair: each round's RPS ratio, the median, the median of the CPU per request
ratio, each side's share of CPU 0 and both CPUs' busy fraction.

Is the pairing fair (numbers: `benchmarks/profiles/gateway-vs-peers-paired-run1.txt`, a
box loaded by other helpers, loadavg 8-15):
- One CPU, shared by sessions: each target is its own session and the kernel's autogroup
  scheduling (`/proc/sys/kernel/sched_autogroup_enabled` = 1 here) splits a CPU between
  sessions, not threads, so the router's tokio threads (it sees one CPU: one worker) or
  the gateway's ledger thread get no extra share. The stub, the targets and the load
  generators run at autogroup nice `--nice` (default -10: ~9x the weight of another
  session) so the other helpers' work takes less of both CPUs; both sides get the same.
- Both saturated? CPU 0 reads 99-100% busy in every row. gw vs gw, router vs router and
  gw vs router split it evenly (43+43%, 42+43%, 45+45% at c=32; the other ~12% is other
  sessions): both sides CPU-bound, and the RPS ratio is the inverse ratio of CPU per
  request. nginx is not: nginx vs nginx takes 28+28%, and against the gateway nginx gets
  30% to the gateway's 46%. At ~40 µs a request nginx waits on its round trips through
  CPU 1 (the stub and wrk, CPU 1 at 100%) and on being scheduled, not on CPU 0; that
  flatters the other side's RPS ratio. The CPU per request ratio (process group CPU from
  /proc, nginx's worker included) is what the ratio would be with both saturated, and is
  printed beside it: read it where the two shares differ. (Solo, in run 2, nginx used
  53-57% of CPU 0 and the gateway 73-79%: nginx waits on its round trips even alone.)
- The load generator: non-streaming, the pair's total RPS is bounded by CPU 0 (two proxies
  on one core), below what one wrk and the stub serve alone (direct: ~23k RPS), so the
  gateway and the router are not waiting on it (their shares are equal and CPU 0 is full);
  nginx is the exception above. Streaming (64 chunks a response, no pacing), the stub and
  the Node stream load generator are heavier than the proxies: CPU 1 is the bottleneck and
  the RPS ratio tends to 1.0 whatever the proxies cost (nginx vs gw 1.05 while the CPU per
  stream ratio is 0.47). There the CPU per request ratio is the measure to read.
- c=1: one request in flight a side, CPU 0 is not saturated; the ratio is one of round
  trips, each side's requests sometimes waiting behind the other's. Read it loosely.
- What pairing does not remove: the box changes what each program costs, not only how
  much CPU it gets. Loaded, the gateway's CPU per request is ~105-140 µs and the router's
  ~100-117 µs, where run 8 (quiet, sequential) served 13.8k and 15.0k RPS from one core
  (at most ~72 and ~67 µs); nginx's is ~40 µs here and at most ~52 µs in run 8. So gw /
  router reads about the same paired-and-loaded as sequential-and-quiet (0.91 / 0.77 vs
  0.92 / 0.79 at c=32), while gw / nginx does not (0.51 / 0.47 vs 0.71 / 0.61): the Python
  gateway (and the router) lose more to the other helpers' cache and core pressure than
  nginx does. The controls show the method's own error, not this; compare gw / nginx only
  between runs on a like box.
- Latency cannot be paired: a target that shares its CPU waits for the other, its
  latency about doubles. The added p50/p99 at c=32 come from solo runs in the same
  invocation (one target loaded at a time, sequential, after each round's pairs), over
  direct (wrk straight at the stub), medians over rounds: the sequential method, kept for
  latency only.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from gateway_ab import Sample, Side, boost, load, measure, paired_round
from gateway_overhead import REPO
from gateway_vs_peers import anchor_row, targets
from profile_gateway import free_port, pinned, stop, wait_ready

SCENARIOS = (("ns", 1), ("ns", 32), ("ns", 256), ("st", 32))
PAIRS = (("gw", "nginx"), ("gw-tenancy", "nginx"), ("gw", "vllm-router"),
         ("gw-tenancy", "vllm-router"))  # fmt: skip
CONTROLS = (("nginx#2", "nginx"), ("vllm-router#2", "vllm-router"), ("gw#2", "gw"))
SOLO = ("direct", "nginx", "vllm-router", "gw", "gw-tenancy")
Round = tuple[Sample, Sample, dict[int, float]]


def start_targets(harness: Path, tmp: Path, key_db: Path, key: str, with_router: bool,
                  procs: list[subprocess.Popen[bytes]], nice: int) -> dict[str, Side]:  # fmt: skip
    """The stub (CPU 1) and every target (CPU 0), started once, each its own session at
    autogroup `nice`, and ready; `procs` collects them for the caller to stop."""
    stub_port = free_port()
    env = {"STUB_PORT": str(stub_port), "STUB_URL": f"http://127.0.0.1:{stub_port}",
           "BENCH_MODEL": "stub-model", "BENCH_API_KEY": key,
           "INFERPLANE_STATE_DIR": str(tmp / "state")}  # fmt: skip
    base = {k: v for k, v in os.environ.items()
            if k not in ("INFERPLANE_REDIS_URL", "INFERPLANE_DATABASE_URL")}  # fmt: skip
    env = {**base, **env}
    procs.append(pinned(1, ["node", "stub/stub_server.js"], tmp / "stub.log", env, harness))
    boost(procs[-1].pid, nice)
    wait_ready(stub_port)
    sides = {"direct": Side(stub_port, key, procs[0].pid)}
    peers = ["nginx", "nginx#2", *(["vllm-router", "vllm-router#2"] if with_router else [])]
    rows = [anchor_row(name) for name in peers]
    rows += targets(tmp, REPO, key_db, ("gw", "gw-tenancy", "gw#2"))[0]
    for row in rows:
        name, port, cmd = (field.strip() for field in row.split("|")[:3])
        slug = name.replace("#", "-")
        run_dir = tmp / "run" / slug  # nginx.sh writes its conf and pid file here
        run_dir.mkdir(parents=True)
        # each router its own metrics port (its default, 29000, admits one router a box)
        own = {"PORT": port, "RUN_DIR": str(run_dir),
               "VLLM_ROUTER_ARGS": f"--prometheus-port {free_port()}"}  # fmt: skip
        procs.append(pinned(0, ["bash", "-c", cmd], tmp / f"{slug}.log", {**env, **own},
                            harness))  # fmt: skip
        boost(procs[-1].pid, nice)
        sides[name] = Side(int(port), key, procs[-1].pid)
    for name, side in sides.items():
        try:
            wait_ready(side.port)
        except SystemExit:
            log = tmp / f"{name.replace('#', '-')}.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            sys.exit(f"{name} did not answer on port {side.port}:\n{tail}")
    return sides


def label(mode: str, conc: int) -> str:
    return f"{'non-stream' if mode == 'ns' else 'stream'} c={conc}"


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def render(pairs: dict[tuple[str, int, str, str], list[Round]],
           solo: dict[tuple[str, str], list[Sample]]) -> str:  # fmt: skip
    head = (f"{'scenario':<17}{'A / B':<28}{'RPS A/B by round':<26}{'median':>8}"
            f"{'CPU/req B/A':>12}{'CPU0 A+B':>10}{'CPU0':>6}{'CPU1':>6}")  # fmt: skip
    out = ["paired: A and B on CPU 0 at the same time (medians over rounds; CPU/req B/A > 1:",
           "A spends less CPU a request; CPU0 A+B: each side's share of CPU 0; CPU0/CPU1: busy)",
           head, "-" * len(head)]  # fmt: skip
    for (mode, conc, a, b), rounds in pairs.items():
        ratios = [sa.rps / sb.rps for sa, sb, _ in rounds]
        cpu = med([sb.cpu_us / sa.cpu_us for sa, sb, _ in rounds])
        shares = (f"{med([sa.cpu_share for sa, _, _ in rounds]) * 100:.0f}+"
                  f"{med([sb.cpu_share for _, sb, _ in rounds]) * 100:.0f}%")  # fmt: skip
        busy = [med([bz[c] for _, _, bz in rounds]) * 100 for c in (0, 1)]
        out.append(f"{label(mode, conc):<17}{a + ' / ' + b:<28}"
                   f"{' '.join(f'{x:.3f}' for x in ratios):<26}{med(ratios):>8.3f}{cpu:>12.3f}"
                   f"{shares:>10}{busy[0]:>5.0f}%{busy[1]:>5.0f}%")  # fmt: skip
    head = f"{'scenario':<17}{'target':<14}{'RPS':>9}{'p50 ms':>9}{'p99 ms':>9}"
    head += f"{'+p50 ms':>9}{'+p99 ms':>9}"
    out += ["", "solo (one target loaded at a time, for latency; medians over rounds):", head,
            "-" * len(head)]  # fmt: skip
    for mode in ("ns", "st"):
        direct = solo.get((mode, "direct"), [])
        d50, d99 = med([s.p50_ms for s in direct]), med([s.p99_ms for s in direct])
        for name in SOLO:
            runs = solo.get((mode, name))
            if not runs:
                continue
            p50, p99 = med([s.p50_ms for s in runs]), med([s.p99_ms for s in runs])
            out.append(f"{label(mode, 32):<17}{name:<14}{med([s.rps for s in runs]):>9,.0f}"
                       f"{p50:>9.2f}{p99:>9.2f}{p50 - d50:>+9.2f}{p99 - d99:>+9.2f}")  # fmt: skip
    return "\n".join(out)


def run_paired(harness: Path, tmp: Path, key_db: Path, key: str, with_router: bool,
               rounds: int, duration: int, nice: int) -> None:  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = []
    try:
        sides = start_targets(harness, tmp, key_db, key, with_router, procs, nice)
        for side in sides.values():  # warm-up, not recorded
            measure(load(harness, side.port, key, 2, 32, False), 2)
        order = [p for p in PAIRS + CONTROLS if p[0] in sides and p[1] in sides]
        pairs: dict[tuple[str, int, str, str], list[Round]] = {
            (mode, conc, a, b): [] for mode, conc in SCENARIOS for a, b in order
        }
        solo: dict[tuple[str, str], list[Sample]] = {}
        for r in range(rounds):
            print(f"round {r + 1}: loadavg {os.getloadavg()[0]:.1f}", flush=True)
            turn = order[r % len(order) :] + order[: r % len(order)]
            for mode, conc in SCENARIOS:
                for a, b in turn:
                    first = (a, b) if r % 2 == 0 else (b, a)  # who gets its load first
                    got, busy = paired_round(harness, {n: sides[n] for n in first},
                                             duration, conc, mode == "st", nice)  # fmt: skip
                    pairs[(mode, conc, a, b)].append((got[a], got[b], busy))
                    print(f"round {r + 1} {label(mode, conc)} {a} {got[a].rps:,.0f} / {b} "
                          f"{got[b].rps:,.0f} RPS = {got[a].rps / got[b].rps:.3f}; CPU/req "
                          f"{got[a].cpu_us:.0f} / {got[b].cpu_us:.0f} µs; CPU0 "
                          f"{busy[0]:.0%} CPU1 {busy[1]:.0%}", flush=True)  # fmt: skip
                    time.sleep(0.5)  # connections the load generators left behind close
            for mode in ("ns", "st"):
                for name in (n for n in SOLO if n in sides):
                    got, busy = paired_round(harness, {name: sides[name]}, duration, 32,
                                             mode == "st", nice)  # fmt: skip
                    one = got[name]
                    solo.setdefault((mode, name), []).append(one)
                    print(f"round {r + 1} solo {label(mode, 32)} {name} {one.rps:,.0f} RPS "
                          f"p50/p99 {one.p50_ms:.2f}/{one.p99_ms:.2f} ms; CPU/req "
                          f"{one.cpu_us:.0f} µs, {one.cpu_share:.0%} of a CPU; CPU0 "
                          f"{busy[0]:.0%} CPU1 {busy[1]:.0%}", flush=True)  # fmt: skip
        print(f"\n{rounds} round(s) x {duration} s; autogroup nice {nice}; vllm-router: "
              f"{'yes' if with_router else 'not installed'}\n")  # fmt: skip
        print(render(pairs, solo))
    finally:
        for proc in procs:
            stop(proc)
