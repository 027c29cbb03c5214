"""PNG plots of bench results: latency vs throughput, TTFT CDF, a replica timeline.

matplotlib is an optional extra (`pip install 'inferplane[plots]'`): it is imported here,
lazily, only when a plot is drawn, so the CLI starts without it and `bench` still writes
its JSON and CSV when it is missing (`PlotsUnavailable` says how to install it).
Files are written atomically (a temporary file in the same directory, then a rename), so
a reader never sees half a PNG.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferplane.deploy.yamlio import write_atomic_bytes

if TYPE_CHECKING:
    from inferplane.bench.load import RunResult, Sweep

# A source checkout (scripts/demo.sh's `pip install -e .`) takes the extra from `.`: the
# package-name form would look the name up on the index instead.
INSTALL_HINT = ("pip install -e '.[plots]' in a source checkout (as scripts/demo.sh "
                "installed it), else pip install 'inferplane[plots]' (or: pip install matplotlib)")
LATENCY_THROUGHPUT_PNG = "latency-throughput.png"
TTFT_CDF_PNG = "ttft-cdf.png"


class PlotsUnavailable(RuntimeError):
    """matplotlib is not installed; the message says how to install it."""


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise PlotsUnavailable(f"plots need matplotlib: {INSTALL_HINT}") from exc
    matplotlib.use("Agg")  # no display: render to memory only
    import matplotlib.pyplot as plt

    return plt


@contextlib.contextmanager
def _figure(width: float, height: float) -> Iterator[tuple[Any, Any]]:
    """One figure and its axes, closed afterwards (pyplot keeps every open figure)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(width, height))
    try:
        yield fig, ax
    finally:
        plt.close(fig)


def _finish(fig: Any, ax: Any, path: Path, *, xlabel: str, ylabel: str, title: str,
            legend_loc: str | None = None) -> Path:
    """The labels, grid and legend every bench plot has, then the PNG at `path`."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc=legend_loc)  # None: matplotlib's default placement
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    """Render `fig` to PNG bytes, then replace `path` atomically."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    write_atomic_bytes(path, buffer.getvalue())
    return path


def _levels(run: RunResult | None, sweep: Sweep | None) -> list[tuple[str, RunResult]]:
    """(label, run) per curve: each sweep level, else the single run."""
    if sweep is not None and sweep.rows:
        return [(f"c={row.concurrency}", row.run) for row in sweep.rows]
    if run is not None:
        return [(run.load.describe(), run)]
    return []


def latency_throughput(path: Path, run: RunResult | None, sweep: Sweep | None) -> Path:
    """E2E latency p50 and p99 (and TTFT p99) against output tokens/s, a point per level;
    the sweep's knee is marked."""
    levels = _levels(run, sweep)
    xs = [r.summary.output_throughput for _, r in levels]
    with _figure(7.0, 4.2) as (fig, ax):
        for key, label, style in (("p50", "E2E latency p50", "o-"),
                                  ("p99", "E2E latency p99", "s--")):
            ax.plot(xs, [r.summary.e2el_ms[key] / 1000 for _, r in levels], style, label=label)
        ax.plot(xs, [r.summary.ttft_ms["p99"] / 1000 for _, r in levels], "^:",
                label="TTFT p99")
        for x, (name, r) in zip(xs, levels, strict=True):
            ax.annotate(name, (x, r.summary.e2el_ms["p50"] / 1000), textcoords="offset points",
                        xytext=(4, -12), fontsize=8)
        if sweep is not None and sweep.knee is not None:
            knee = next(r for r in sweep.rows if r.concurrency == sweep.knee)
            ax.axvline(knee.run.summary.output_throughput, color="grey", lw=0.8, ls="--")
            ax.annotate(f"knee c={sweep.knee}", (knee.run.summary.output_throughput, 0),
                        xycoords=("data", "axes fraction"), xytext=(4, 6),
                        textcoords="offset points", fontsize=8, color="grey")
        ax.set_ylim(bottom=0)
        return _finish(fig, ax, path, xlabel="output throughput (tokens/s)",
                       ylabel="latency (s)", title="latency vs throughput")


def ttft_cdf(path: Path, run: RunResult | None, sweep: Sweep | None) -> Path:
    """Empirical CDF of time to first token over successful requests, a curve per level."""
    with _figure(7.0, 4.2) as (fig, ax):
        for name, r in _levels(run, sweep):
            values = sorted(x.ttft_s * 1000 for x in r.results if x.success)
            if not values:
                continue
            ys = [(i + 1) / len(values) for i in range(len(values))]
            ax.step(values, ys, where="post", label=name)
        ax.set_ylim(0, 1.02)
        ax.set_xlim(left=0)
        return _finish(fig, ax, path, xlabel="time to first token (ms)",
                       ylabel="fraction of requests", title="TTFT CDF")


def write_plots(out_dir: Path, run: RunResult | None, sweep: Sweep | None) -> list[Path]:
    """Both bench plots into `out_dir`; raises PlotsUnavailable without matplotlib."""
    if not _levels(run, sweep):
        return []
    return [latency_throughput(out_dir / LATENCY_THROUGHPUT_PNG, run, sweep),
            ttft_cdf(out_dir / TTFT_CDF_PNG, run, sweep)]


def replica_timeline(path: Path, series: Mapping[str, Sequence[tuple[float, int]]],
                     hours: float, colors: dict[str, str] | None = None) -> Path:
    """Awake replicas per model over simulated hours (step lines), one colour per model."""
    with _figure(9.0, 3.4) as (fig, ax):
        for model, points in series.items():
            if not points:
                continue
            xs = [t for t, _ in points] + [hours]
            ys = [n for _, n in points] + [points[-1][1]]
            ax.step(xs, ys, where="post", label=model, lw=1.6,
                    color=(colors or {}).get(model))
        from matplotlib.ticker import MaxNLocator

        ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # replicas are whole
        ax.set_xlim(0, hours)
        ax.set_ylim(bottom=0)
        ax.set_xticks(range(0, int(hours) + 1, 3 if hours > 12 else 1))
        return _finish(fig, ax, path, xlabel="simulated hour of day", ylabel="awake replicas",
                       title="replicas per model", legend_loc="upper left")
