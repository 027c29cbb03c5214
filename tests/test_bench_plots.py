"""`inferplane bench` PNG plots: written beside the JSON, decodable, optional.

PNGs are checked by their header, size and by decoding them (matplotlib's reader), never
pixel by pixel. Without matplotlib `bench` still writes JSON and CSV and says how to get
the plots.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferplane.bench.client import RequestResult
from inferplane.bench.load import LoadSpec, RunResult, Sweep, SweepRow, find_knee
from inferplane.bench.metrics import summarize
from inferplane.bench.plots import (
    LATENCY_THROUGHPUT_PNG,
    TTFT_CDF_PNG,
    PlotsUnavailable,
    replica_timeline,
    write_plots,
)
from inferplane.cli.main import _register_commands, app
from inferplane.sim import EngineHost, SimEngineConfig

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from the IHDR chunk, after checking the signature."""
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR", path
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def decodes(path: Path) -> bool:
    import matplotlib.image

    pixels = matplotlib.image.imread(str(path))
    return bool(pixels.shape[0] > 0 and pixels.shape[1] > 0)


def _run(level: int, ttft_s: float, tok_s: float) -> RunResult:
    """A synthetic closed-loop run: `level` x 4 requests of 10 tokens."""
    results = [
        RequestResult(model="m", prompt_tokens=32, output_tokens=10, success=True,
                      ttft_s=ttft_s * (1 + i / 20), latency_s=ttft_s + 10 * level / tok_s)
        for i in range(level * 4)
    ]
    duration = sum(r.output_tokens for r in results) / tok_s
    return RunResult(LoadSpec("concurrency", concurrency=level), summarize(results, duration),
                     results, started_at=0.0)


def _sweep() -> Sweep:
    rows = [SweepRow(c, _run(c, 0.02 * c, tok)) for c, tok in
            ((1, 60.0), (2, 118.0), (4, 240.0), (8, 260.0))]
    knee = find_knee([(r.concurrency, r.run.summary.output_throughput) for r in rows])
    return Sweep(rows, knee, "saturated")


def test_sweep_plots_are_pngs_that_decode(tmp_path: Path) -> None:
    sweep = _sweep()
    assert sweep.knee == 4  # 240 tok/s is 92% of the peak (the 90% rule)
    written = write_plots(tmp_path, None, sweep)
    assert [p.name for p in written] == [LATENCY_THROUGHPUT_PNG, TTFT_CDF_PNG]
    for path in written:
        width, height = png_size(path)
        assert width >= 400 and height >= 250
        assert path.stat().st_size > 5_000  # axes, lines and labels, not an empty canvas
        assert decodes(path)
    assert not list(tmp_path.glob(".*"))  # no temporary files left behind


def test_a_single_run_gets_both_plots(tmp_path: Path) -> None:
    written = write_plots(tmp_path, _run(2, 0.05, 100.0), None)
    assert {p.name for p in written} == {LATENCY_THROUGHPUT_PNG, TTFT_CDF_PNG}
    assert all(decodes(p) for p in written)


def test_a_plot_replaces_an_existing_file_whole(tmp_path: Path) -> None:
    target = tmp_path / TTFT_CDF_PNG
    target.write_bytes(b"stale")
    write_plots(tmp_path, _run(1, 0.05, 50.0), None)
    assert target.read_bytes()[:8] == PNG_MAGIC


def test_replica_timeline(tmp_path: Path) -> None:
    path = replica_timeline(tmp_path / "timeline.png",
                            {"qa": [(0.0, 1), (9.0, 3), (18.0, 1)], "batch": [(0.0, 2), (6.0, 0)]},
                            24.0, colors={"qa": "tab:blue", "batch": "tab:red"})
    assert png_size(path)[0] >= 600 and decodes(path)


def test_without_matplotlib_bench_still_writes_json_and_csv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A None entry in sys.modules makes `import matplotlib` raise ImportError.
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(PlotsUnavailable, match=r"inferplane\[plots\]"):
        write_plots(tmp_path / "direct", _run(1, 0.05, 50.0), None)

    _register_commands()
    with EngineHost([SimEngineConfig(model="m", max_model_len=2048)]) as handles:
        result = CliRunner().invoke(app, [
            "bench", handles[0].url, "--num-requests", "3", "--concurrency", "1",
            "--input-len", "16", "--output-len", "3", "--out", str(tmp_path), "--json",
        ])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["run"]["completed"] == 3  # stdout: one JSON document
    assert "no PNG plots written" in result.stderr and "inferplane[plots]" in result.stderr
    assert (tmp_path / "bench.json").exists() and (tmp_path / "requests.csv").exists()
    assert not (tmp_path / TTFT_CDF_PNG).exists()


def test_bench_writes_plots_beside_the_json(tmp_path: Path) -> None:
    _register_commands()
    with EngineHost([SimEngineConfig(model="m", max_model_len=2048)]) as handles:
        result = CliRunner().invoke(app, [
            "bench", handles[0].url, "--num-requests", "4", "--concurrency", "2",
            "--input-len", "16", "--output-len", "3", "--out", str(tmp_path),
        ])
    assert result.exit_code == 0, result.output
    for name in (LATENCY_THROUGHPUT_PNG, TTFT_CDF_PNG):
        assert decodes(tmp_path / name)


def test_bench_help_does_not_import_matplotlib() -> None:
    from test_first_hour_imports import imported_modules

    names = imported_modules("bench", "--help")
    assert not [n for n in names if n == "matplotlib" or n.startswith("matplotlib.")]
