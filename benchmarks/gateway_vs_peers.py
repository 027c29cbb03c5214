"""The gateway against nginx and the Rust vLLM router, bare and with tenancy, in one run.

Drives the shared proxy harness (`../shared/bench/gateway`, see its README: Node stub
engine, wrk for non-streaming c=1/32/256, the Node stream load generator for streaming
c=32; the proxy under test pinned to CPU 0, stub + load generator to CPU 1; targets
alternated per round) with these targets, all in the same invocation:

    direct, nginx, vllm-router     the harness's anchors (vllm-router when installed:
                                   its setup.sh, `pip install vllm-router`)
    gw-base, gw-base-tenancy       the gateway at `--baseline-ref` (default: main), bare
                                   and with tenancy: "today's gateway" measured alongside
    gw, gw-tenancy                 this checkout, bare and with tenancy
    gw-trace0                      this checkout, bare, tracing on with sample_ratio 0
                                   (OTLP endpoint on a closed port: nothing is exported)

Tenancy: one API key with RPM/TPM/concurrency limits far too high to trigger, in-memory
limiter, each tenancy gateway its own copy of the SQLite store (the usage ledger). The
load generators send that key to every target.

Prints per scenario the RPS, p50/p99, the latency added over direct, and the ratios the
issue asks for (gw / nginx, gw / vllm-router, this checkout over the baseline, tracing
sample_ratio 0 over tracing off). Numbers are ratios within this run only.

    python benchmarks/gateway_vs_peers.py                       # 1 round x 5 s (~6 min)
    python benchmarks/gateway_vs_peers.py --rounds 2 --duration 6 --baseline-ref HEAD~3
    python benchmarks/gateway_vs_peers.py --only nginx,gw,gw-tenancy   # a subset
    python benchmarks/gateway_vs_peers.py --paired --rounds 3 --duration 5   # (~12 min)

`--paired`: instead of one target after another, each gateway (bare, tenancy) and a peer
share CPU 0 at the same time, with controls (a peer against itself, the gateway against
itself) and solo runs at c=32 for the latency; why and how fair, see
`benchmarks/peers_paired.py`. `--only` and `--baseline-ref` do not apply there.

Needs: node, wrk, nginx (apt-get install wrk nginx-light), optionally vllm-router.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from gateway_ab import export_ref
from gateway_overhead import REPO, _create_key, ensure_tools, summarize
from profile_gateway import HARNESS, free_port

GATEWAYS = ("gw-base", "gw-base-tenancy", "gw", "gw-tenancy", "gw-trace0")
TRACE0 = "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:9 OTEL_TRACES_SAMPLER_ARG=0"
VLLM_ROUTER = Path(os.environ.get("VLLM_ROUTER_VENV", f"{tempfile.gettempdir()}/gw-bench-venvs"
                                  "/vllm-router")) / "bin" / "vllm-router"  # fmt: skip


def targets(tmp: Path, base_tree: Path, key_db: Path,
            gateways: tuple[str, ...] = GATEWAYS) -> tuple[list[str], list[str]]:  # fmt: skip
    """(--target lines for run_all.sh, target names) of the gateway rows. A name with a
    suffix after `#` (`gw#2`) is another instance of the row before it."""
    lines, names = [], []
    for name in gateways:
        tree = base_tree if name.startswith("gw-base") else REPO
        env = f"PYTHONPATH={tree}"
        flags = "--no-tenancy"
        if name.partition("#")[0].endswith("tenancy"):
            db = tmp / f"{name.replace('#', '-')}.db"
            shutil.copy(key_db, db)
            flags = f"--tenancy --db sqlite:///{db}"
        if name == "gw-trace0":
            env += " " + TRACE0
        cmd = (f"cd {tree} && env {env} {sys.executable} -m inferplane gateway --host 127.0.0.1"
               f" --port $PORT --backend $BENCH_MODEL=$STUB_URL {flags}")  # fmt: skip
        lines.append(f"{name}|{free_port()}|{cmd}")
        names.append(name)
    return lines, names


def anchor_row(name: str) -> str:
    """The harness's targets.conf row of nginx or vllm-router (`nginx#2`: a second one) on a
    free port (no fixed-port clash with anything else running on this machine)."""
    if name.partition("#")[0] == "nginx":
        return f"{name} | {free_port()} | bash targets/nginx.sh | nginx -v 2>&1"
    return (f"{name} | {free_port()} | bash targets/vllm_router.sh | "
            f"{VLLM_ROUTER} --version 2>&1 | head -1")  # fmt: skip


def anchors_file(tmp: Path, harness: Path, with_router: bool) -> Path:
    """The harness's direct/nginx(/vllm-router) targets."""
    rows = ["direct | stub | - | node --version", anchor_row("nginx")]
    if with_router:
        rows.append(anchor_row("vllm-router"))
    path = tmp / "targets.conf"
    path.write_text("\n".join(rows) + "\n")
    return path


def ratio(table: dict[tuple[str, int, str], dict[str, float]], mode: str, conc: int,
          num: str, den: str) -> str:  # fmt: skip
    a, b = table.get((mode, conc, num)), table.get((mode, conc, den))
    if not a or not b or not b["rps"]:
        return "–"
    return f"{a['rps'] / b['rps']:.3f}"


def render(table: dict[tuple[str, int, str], dict[str, float]]) -> str:
    scenarios = sorted({(m, c) for m, c, _ in table}, key=lambda s: (s[0] != "ns", s[1]))
    names = sorted({t for _, _, t in table}, key=lambda t: (t not in ("direct", "nginx",
                   "vllm-router"), t))  # fmt: skip
    head = (f"{'scenario':<17}{'target':<17}{'RPS':>9}{'p50 ms':>9}{'p99 ms':>9}"
            f"{'+p50 ms':>9}{'+p99 ms':>9}{'errors':>8}")  # fmt: skip
    out = [head, "-" * len(head)]
    for mode, conc in scenarios:
        label = f"{'non-stream' if mode == 'ns' else 'stream'} c={conc}"
        direct = table.get((mode, conc, "direct"))
        for name in names:
            row = table.get((mode, conc, name))
            if row is None:
                continue
            d50 = row["p50_ms"] - direct["p50_ms"] if direct else float("nan")
            d99 = row["p99_ms"] - direct["p99_ms"] if direct else float("nan")
            out.append(f"{label:<17}{name:<17}{row['rps']:>9,.0f}{row['p50_ms']:>9.2f}"
                       f"{row['p99_ms']:>9.2f}{d50:>+9.2f}{d99:>+9.2f}"
                       f"{row['errors']:>8.0f}")  # fmt: skip
    out += ["", "ratios (RPS, same run):",
            f"{'scenario':<17}" + "".join(f"{h:>13}" for h in (
                "gw/nginx", "gwT/nginx", "gw/router", "gwT/router", "gw/base", "gwT/baseT",
                "trace0/off"))]  # fmt: skip
    pairs = [("gw", "nginx"), ("gw-tenancy", "nginx"), ("gw", "vllm-router"),
             ("gw-tenancy", "vllm-router"), ("gw", "gw-base"),
             ("gw-tenancy", "gw-base-tenancy"), ("gw-trace0", "gw")]  # fmt: skip
    for mode, conc in scenarios:
        label = f"{'non-stream' if mode == 'ns' else 'stream'} c={conc}"
        out.append(f"{label:<17}" + "".join(f"{ratio(table, mode, conc, a, b):>13}"
                                            for a, b in pairs))  # fmt: skip
    out.append("(gwT: gw-tenancy; base: the gateway at --baseline-ref; router: vllm-router)")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--harness", type=Path, default=HARNESS)
    parser.add_argument("--baseline-ref", default="main", help="git ref of gw-base rows")
    parser.add_argument("--duration", type=int, default=5, help="seconds per load run")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--only", default="", help="comma list of targets (default: all)")
    parser.add_argument("--verbose", action="store_true", help="show the harness's progress")
    parser.add_argument("--paired", action="store_true", help="each gateway and a peer on one "
                        "CPU at the same time (benchmarks/peers_paired.py)")  # fmt: skip
    parser.add_argument("--nice", type=int, default=-10,
                        help="--paired: autogroup nice of the stub, targets and load "
                        "generators (0: as the rest of the box)")  # fmt: skip
    args = parser.parse_args()
    if not (args.harness / "run_all.sh").exists():
        sys.exit(f"no harness at {args.harness}; pass --harness DIR (shared/bench/gateway)")
    if shutil.which("node") is None:
        sys.exit("the harness's stub and stream load generator need node")
    ensure_tools()
    with_router = VLLM_ROUTER.exists()
    if not with_router:
        print(f"vllm-router not installed ({VLLM_ROUTER}): its rows are left out; "
              "install it with the harness's setup.sh", file=sys.stderr)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="gw-peers-") as tmp_s:
        tmp = Path(tmp_s)
        key_db = tmp / "key.db"
        key = asyncio.run(_create_key(f"sqlite:///{key_db}"))
        if args.paired:
            from peers_paired import run_paired  # it imports this module's launchers

            run_paired(args.harness, tmp, key_db, key, with_router, args.rounds, args.duration,
                       args.nice)  # fmt: skip
            return
        base_tree = export_ref(args.baseline_ref, tmp / "base")
        lines, names = targets(tmp, base_tree, key_db)
        only = ["direct", "nginx", *(["vllm-router"] if with_router else []), *names]
        if args.only:
            wanted = set(args.only.split(","))
            only = [t for t in only if t in wanted or t == "direct"]
        env = {**os.environ, "DURATION": str(args.duration), "ROUNDS": str(args.rounds),
               "OUT_DIR": str(tmp / "out"), "BENCH_API_KEY": key,
               "STUB_PORT": str(free_port()),
               "TARGETS_FILE": str(anchors_file(tmp, args.harness, with_router)),
               "INFERPLANE_STATE_DIR": str(tmp / "state")}  # fmt: skip
        for name in ("INFERPLANE_REDIS_URL", "INFERPLANE_DATABASE_URL"):
            env.pop(name, None)
        argv = ["bash", "run_all.sh", "--only", ",".join(only)]
        for line in lines:
            argv += ["--target", line]
        subprocess.run(argv, cwd=args.harness, env=env, check=True,
                       stdout=None if args.verbose else subprocess.DEVNULL)  # fmt: skip
        raws = sorted((tmp / "out").glob("*.jsonl"))
        if not raws:
            sys.exit("the harness wrote no results")
        print(f"baseline ref: {args.baseline_ref}; {args.rounds} round(s) x {args.duration} s;"
              f" vllm-router: {'yes' if with_router else 'not installed'}\n")  # fmt: skip
        print(render(summarize(raws[-1])))


if __name__ == "__main__":
    main()
