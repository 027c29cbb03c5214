"""Day/night replay: the local autoscaler against a static peak allocation, on the simulator.

A compressed 24-hour trace (1 simulated hour per `--hour-s` wall seconds, 10 by default)
runs against `inferplane up`'s runtime with simulated engines on 127.0.0.1:

- `qa`: daytime Q&A (S4), a base load and a peak around 13:00, floor 1 replica;
- `batch`: the night batch, a peak around 02:00, scaled to zero in the day, sleeping
  (vLLM sleep mode level 1) instead of stopping;
- `campaign`: a burst from 20:00 to 20:45, scaled from zero and back (cold starts).

The scaling windows are the fleet-file defaults compressed like the clock (120 s up,
600 s down, 300 s stabilization). A cold start takes `--cold-start-min` simulated minutes
(`--load-time-s` of the engine); wake times are the simulator's sleep-mode model.

It prints one table: GPU-seconds of the elastic run (every awake replica, starting ones
included, holds one GPU; a sleeping one frees it) against the static allocation that
meets the same peak (each model's peak replica count for the whole day), requests sent,
answered, held (no awake replica when they arrived) and lost (any non-200 or error: must
be 0), TTFT p50/p99 (streaming, client side) and SLO attainment outside cold starts,
cold starts and wakes with their times. The replica timeline is saved as a PNG
(`--out`; a matplotlib chart with the `plots` extra, a plain one without).

    python benchmarks/elastic_replay.py                 # 24 h at 10 s per hour (~4 min)
    python benchmarks/elastic_replay.py --hour-s 5      # faster, same shape

Exit code 1 when a request is lost or the GPU-seconds saving is below 30%.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import struct
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from inferplane.runtime import Runtime, RuntimeOptions, SupervisorSettings  # noqa: E402
from inferplane.scaling.events import read_events  # noqa: E402
from inferplane.sim.config import FaultConfig  # noqa: E402
from inferplane.spec import parse_fleet  # noqa: E402

MODELS = ("qa", "batch", "campaign")
FLEET = """\
engine: sim
models:
  - name: qa
    source: Qwen/Qwen3-0.6B
    max_model_len: 4096
    max_num_seqs: 4
    replicas: 1
    routing: {{max_queue_depth: 4096, max_queue_wait_s: {wait}}}
  - name: batch
    source: Qwen/Qwen3-0.6B
    max_model_len: 4096
    max_num_seqs: 4
    replicas: 0
    routing: {{max_queue_depth: 4096, max_queue_wait_s: {wait}}}
  - name: campaign
    source: Qwen/Qwen3-0.6B
    max_model_len: 4096
    max_num_seqs: 4
    replicas: 0
    routing: {{max_queue_depth: 4096, max_queue_wait_s: {wait}}}
scaling:
  policy:
    target_waiting_requests: {target}
    scale_up_window_s: {up}
    scale_down_window_s: {down}
    stabilization_s: {stab}
  models:
    qa: {{min_replicas: 1, max_replicas: 4}}
    batch: {{min_replicas: 0, max_replicas: 3, sleep: {{level: 1}}}}
    campaign: {{min_replicas: 0, max_replicas: 3}}
"""


def _bump(h: float, center: float, width: float) -> float:
    d = min(abs(h - center), 24 - abs(h - center))  # the day wraps
    return math.exp(-0.5 * (d / width) ** 2)


def rate(model: str, h: float) -> float:
    """Requests per wall second at simulated hour `h`."""
    if model == "qa":
        return 0.3 + 2.7 * _bump(h, 13.0, 2.5)
    if model == "batch":
        r = 2.4 * _bump(h, 2.0, 1.8)
        return r if r > 0.05 else 0.0
    return 2.5 if 20.0 <= h < 20.75 else 0.0


@dataclass
class Result:
    model: str
    at_h: float
    held: bool
    ttft_s: float | None = None
    status: int = 0
    error: str | None = None


async def _request(session: aiohttp.ClientSession, url: str, model: str, out: Result,
                   max_tokens: int) -> None:
    t0 = time.monotonic()
    body = {"model": model, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "messages": [{"role": "user", "content": "summarise the day"}]}
    try:
        async with session.post(url + "/v1/chat/completions", json=body) as resp:
            out.status = resp.status
            async for line in resp.content:
                if (out.ttft_s is None and line.startswith(b"data: {")
                        and b'"content"' in line and b'"content":""' not in line):
                    out.ttft_s = time.monotonic() - t0
            if resp.status != 200:
                out.error = f"HTTP {resp.status}"
    except (aiohttp.ClientError, TimeoutError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"


def _png(path: Path, series: dict[str, list[tuple[float, int]]], hours: float,
         top: int) -> None:
    """A plain PNG of replicas per model over the day (no plotting library needed)."""
    w, h, pad = 960, 320, 20
    colors = {"qa": (31, 119, 180), "batch": (214, 39, 40), "campaign": (44, 160, 44)}
    img = [[(255, 255, 255)] * w for _ in range(h)]
    for hour in range(int(hours) + 1):  # hour grid, 6-hour lines darker
        x = pad + int((w - 2 * pad) * hour / hours)
        shade = 200 if hour % 6 else 150
        for y in range(pad, h - pad):
            img[y][x] = (shade, shade, shade)
    for level in range(top + 1):
        y = h - pad - int((h - 2 * pad) * level / top)
        for x in range(pad, w - pad):
            img[y][x] = (220, 220, 220) if level else (0, 0, 0)
    for offset, (model, points) in enumerate(series.items()):
        color = colors.get(model, (0, 0, 0))
        for (t0, n0), (t1, _) in zip(points, [*points[1:], (hours, points[-1][1])],
                                     strict=False):
            x0 = pad + int((w - 2 * pad) * t0 / hours)
            x1 = pad + int((w - 2 * pad) * t1 / hours)
            y = h - pad - int((h - 2 * pad) * n0 / top) - offset  # offset: lines stay apart
            for x in range(x0, min(x1 + 1, w - pad)):
                for dy in (0, 1):
                    img[max(0, y - dy)][x] = color
    raw = b"".join(b"\x00" + bytes(c for px in row for c in px) for row in img)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2,
                                                                        0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def _save_timeline(path: Path, series: dict[str, list[tuple[float, int]]], hours: float,
                   peak: dict[str, int]) -> str:
    """The replica timeline as a matplotlib chart (axes, hours, legend) when the `plots`
    extra is installed, else the plain PNG above; returns what was written."""
    from inferplane.bench.plots import PlotsUnavailable, replica_timeline

    try:
        replica_timeline(path, series, hours, colors={
            "qa": "tab:blue", "batch": "tab:red", "campaign": "tab:green"})
        return f"{path} (replicas per model over the simulated day)"
    except PlotsUnavailable as exc:
        _png(path, series, hours, max(4, *peak.values()))
        return (f"{path} (plain: qa blue, batch red, campaign green; a column per hour; "
                f"for axes and a legend: {exc})")


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, math.ceil(q * len(values)) - 1)]


async def replay(args: argparse.Namespace) -> int:
    hour_s = args.hour_s
    minute_s = hour_s / 60
    text = FLEET.format(target=args.target_waiting,
                        wait=max(30.0, 20 * minute_s), up=round(2 * minute_s, 3),
                        down=round(10 * minute_s, 3), stab=round(5 * minute_s, 3))
    fleet = parse_fleet(text, filename="elastic_replay.yaml")
    fault = FaultConfig(load_time_s=args.cold_start_min * minute_s, slowdown=args.slowdown)
    settings = SupervisorSettings(probe_interval_s=0.5, probe_timeout_s=2.0,
                                  startup_deadline_s=60, backoff_initial_s=0.2,
                                  backoff_max_s=2.0, stop_timeout_s=5)
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        rt = Runtime(fleet, RuntimeOptions(
            state_dir=Path(tmp) / "state", gateway_port=0, settings=settings,
            faults=dict.fromkeys(MODELS, fault), tenancy=False, control=False,
            access_log=False, grace_period_s=30, scaling_interval_s=min(0.25, minute_s),
        ))
        await rt.start()
        await rt.wait_settled(60)
        url = rt.gateway_url
        results: list[Result] = []
        tasks: set[asyncio.Task[None]] = set()
        timeline: dict[str, list[tuple[float, int]]] = {m: [] for m in MODELS}
        gpu_s = 0.0
        peak = dict.fromkeys(MODELS, 0)
        duration = args.hours * hour_s
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            start = time.monotonic()
            next_arrival = {m: 0.0 for m in MODELS}
            last_sample = start
            while (now := time.monotonic()) - start < duration:
                h = (now - start) / hour_s
                dt = now - last_sample
                last_sample = now
                for m in MODELS:
                    n = len(rt.awake_replicas(m))
                    gpu_s += n * dt
                    peak[m] = max(peak[m], n)
                    if not timeline[m] or timeline[m][-1][1] != n:
                        timeline[m].append((h, n))
                    r = rate(m, h)
                    if r <= 0:
                        next_arrival[m] = now - start
                        continue
                    while next_arrival[m] <= now - start:
                        next_arrival[m] += rng.expovariate(r)
                        pool = rt.gateway.state.pools[m]
                        res = Result(m, h, held=not pool.any_routable())
                        results.append(res)
                        task = asyncio.create_task(
                            _request(session, url, m, res, args.max_tokens))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                await asyncio.sleep(0.02)
            if tasks:
                await asyncio.wait(tasks, timeout=120)
        metrics = rt.gateway.metrics.render().decode()
        events = read_events(rt.state_dir.path)
        await rt.drain_and_stop()

    static_s = sum(peak.values()) * duration
    answered = [r for r in results if r.status == 200 and r.error is None]
    lost = [r for r in results if r.status != 200 or r.error is not None]
    warm = [r for r in answered if not r.held and r.ttft_s is not None]
    cold = [r for r in answered if r.held]
    slo_ok = [r for r in warm if r.ttft_s is not None and r.ttft_s <= args.slo_ttft_s]
    wakes = [e for e in events if e["kind"] == "wake"]
    starts = [e for e in events if e["kind"] == "scale_up"]
    wake_times = [float(e["reason"].rsplit(" in ", 1)[1].split(" s")[0]) for e in wakes
                  if " in " in e["reason"]]
    cold_ttft = [r.ttft_s for r in cold if r.ttft_s is not None]

    def row(name: str, value: str) -> None:
        print(f"{name:<44} {value}")

    print(f"elastic replay: {args.hours:g} simulated hours at {hour_s:g} s/hour "
          f"({duration:.0f} s wall), seed {args.seed}")
    row("GPU-seconds, elastic (awake replicas)", f"{gpu_s:.0f}")
    row("GPU-seconds, static peak allocation", f"{static_s:.0f}  (peak replicas "
        + ", ".join(f"{m} {peak[m]}" for m in MODELS) + ")")
    ratio = gpu_s / static_s if static_s else float("nan")
    row("ratio elastic / static", f"{ratio:.2f}  ({(1 - ratio):.0%} fewer GPU-seconds)")
    row("requests sent / answered", f"{len(results)} / {len(answered)}")
    row("requests lost (non-200 or error)", f"{len(lost)}")
    row("requests held (no awake replica on arrival)", f"{len(cold)}")
    row("TTFT p50 / p99 outside cold starts (s)",
        f"{_pct([r.ttft_s for r in warm if r.ttft_s], 0.5):.3f} / "
        f"{_pct([r.ttft_s for r in warm if r.ttft_s], 0.99):.3f}")
    row(f"SLO attainment (TTFT <= {args.slo_ttft_s:g} s, outside cold)",
        f"{len(slo_ok) / max(1, len(warm)):.2%}")
    row("TTFT of held requests p50 / max (s)",
        f"{_pct(cold_ttft, 0.5):.2f} / {max(cold_ttft, default=float('nan')):.2f}")
    row("scale-ups (new engines) / wakes", f"{len(starts)} / {len(wakes)}")
    row("wake time p50 / max (s)", f"{_pct(wake_times, 0.5):.3f} / "
        f"{max(wake_times, default=float('nan')):.3f}")
    row("cold start (engine load) per start (s)", f"{fault.load_time_s:.2f}")
    for line in metrics.splitlines():
        if line.startswith("inferplane_model_cold_starts_total{"):
            row("  " + line.split(" ")[0], line.split(" ")[1])
    for m in MODELS:
        per = [r for r in results if r.model == m]
        row(f"  {m}: sent / lost / held", f"{len(per)} / "
            f"{sum(1 for r in lost if r.model == m)} / {sum(1 for r in cold if r.model == m)}")
    for miss in lost[:5]:
        print(f"  lost: {miss.model} at {miss.at_h:.2f} h: {miss.error}")
    out = Path(args.out)
    print(f"replica timeline: {_save_timeline(out, timeline, args.hours, peak)}")
    return 1 if lost or ratio > 0.7 else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hour-s", type=float, default=10.0, help="wall seconds per simulated hour")
    p.add_argument("--hours", type=float, default=24.0, help="simulated hours to replay")
    p.add_argument("--cold-start-min", type=float, default=2.0,
                   help="simulated minutes an engine takes to load")
    p.add_argument("--slowdown", type=float, default=40.0,
                   help="engine step-time multiplier (sizes a replica's throughput)")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--target-waiting", type=int, default=1,
                   help="scaling.policy.target_waiting_requests")
    p.add_argument("--slo-ttft-s", type=float, default=2.0, help="TTFT target (wall s)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", default=str(REPO / "out" / "elastic_replay.png"))
    return asyncio.run(replay(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
