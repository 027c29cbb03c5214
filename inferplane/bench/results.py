"""Writing results: one JSON document per run (or sweep) and CSV files beside it."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from inferplane.bench.load import RunResult, Sweep

REQUEST_COLUMNS = ("model", "success", "sent_ms", "prompt_tokens", "output_tokens", "ttft_ms",
                   "tpot_ms", "e2el_ms", "itl_mean_ms", "error")


def request_rows(run: RunResult) -> list[dict[str, Any]]:
    """One row per request; `sent_ms` is when it was sent, after the run's first request
    (arrival patterns: how many requests a closed loop sends together)."""
    sent = [r.start_s for r in run.results if r.start_s]
    first = min(sent) if sent else 0.0
    rows = []
    for r in run.results:
        rows.append({
            "model": r.model, "success": r.success,
            "sent_ms": round((r.start_s - first) * 1000, 3) if r.start_s else "",
            "prompt_tokens": r.prompt_tokens,
            "output_tokens": r.output_tokens, "ttft_ms": round(r.ttft_s * 1000, 3),
            "tpot_ms": round(r.tpot_s * 1000, 3), "e2el_ms": round(r.latency_s * 1000, 3),
            "itl_mean_ms": round(sum(r.itl_s) / len(r.itl_s) * 1000, 3) if r.itl_s else 0.0,
            "error": r.error,
        })
    return rows


def _write_csv(path: Path, rows: list[dict[str, Any]], columns: tuple[str, ...]) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def write_results(out_dir: Path, document: dict[str, Any], run: RunResult | None,
                  sweep: Sweep | None) -> list[Path]:
    """`bench.json` (everything), `requests.csv` (per request of a run), `sweep.csv`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "bench.json"]
    written[0].write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    if run is not None:
        path = out_dir / "requests.csv"
        _write_csv(path, request_rows(run), REQUEST_COLUMNS)
        written.append(path)
    if sweep is not None:
        rows = [r.as_dict() for r in sweep.rows]
        path = out_dir / "sweep.csv"
        _write_csv(path, rows, tuple(rows[0]) if rows else ("concurrency",))
        written.append(path)
    return written
