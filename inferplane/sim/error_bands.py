"""How far the simulator's timing is from real vLLM, measured, for the GPU and model at hand.

`error_bands.json` (next to this file) is written by `benchmarks/sim_fidelity.py
--write-bands` from the held-out split of benchmarks/data/published_serving.json: per GPU
type and model family (dense / MoE) the median and worst |error| of TTFT, TPOT and output
throughput over the published runs the fit never saw. `band_for` turns it into the sentence
`capacity` and `bench` print, and says what is missing when no held-out run backs the GPU,
the family or the weight format (so the numbers are not read as validated there).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from inferplane.gpus.spec import GpuSpec
from inferplane.sim.formats import generation

BANDS_FILE = Path(__file__).with_name("error_bands.json")
METRICS = ("tpot", "throughput", "ttft")


@dataclass(frozen=True)
class Band:
    """The statement for one (GPU, family, format) and what no data backs."""

    statement: str  # "±N% TPOT, ..." or "" when nothing is measured
    missing: tuple[str, ...]  # e.g. ("GPU B200 (blackwell)", "format fp4")

    def lines(self) -> list[str]:
        out = [f"simulated timing: {self.statement}"] if self.statement else []
        if self.missing:
            out.append("warning: no held-out published runs for " + ", ".join(self.missing)
                       + ": the simulated timing is not validated there")
        return out


@lru_cache(maxsize=1)
def load_bands(path: Path = BANDS_FILE) -> dict[str, Any]:
    if not path.is_file():
        return {"groups": [], "formats": {}}
    doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return doc


def _format_band(group: dict[str, Any]) -> str:
    parts = [f"±{group[m]['median']:.0f}% {name}" for m, name in
             (("tpot", "TPOT"), ("throughput", "throughput"), ("ttft", "TTFT"))]
    worst = max(group[m]["max"] for m in METRICS)
    return (f"{', '.join(parts)} (median |error| on {group['n']} held-out published vLLM "
            f"runs, {group['gpu']} {group['family']}; worst {worst:.0f}%)")


def band_for(gpu: GpuSpec, family: str, weight_format: str) -> Band:
    """The measured error band of the simulator on `gpu` for a `family` ("dense" or
    "moe") model in `weight_format` ("bf16", "fp8", "mxfp4", ...)."""
    doc = load_bands()
    groups = doc.get("groups", [])
    missing: list[str] = []
    exact = [g for g in groups if g["gpu"] == gpu.name and g["family"] == family]
    statement = _format_band(exact[0]) if exact else ""
    if not exact:
        same_gen = [g for g in groups if g["generation"] == generation(gpu)
                    and g["family"] == family]
        if same_gen:
            best = max(same_gen, key=lambda g: int(g["n"]))
            statement = (_format_band(best) + f"; measured on {best['gpu']}, not on "
                         f"{gpu.name} itself (same generation, {generation(gpu)})")
        on_gpu = [g for g in groups if g["gpu"] == gpu.name]
        if not on_gpu:
            missing.append(f"GPU {gpu.name} ({generation(gpu)})")
        if not any(g["family"] == family for g in groups):
            missing.append(f"{family} models")
        elif on_gpu:
            missing.append(f"{family} models on {gpu.name}")
    formats: dict[str, list[str]] = doc.get("formats", {})
    if weight_format != "bf16" and generation(gpu) not in formats.get(weight_format, []):
        missing.append(f"{weight_format} weights on {generation(gpu)} GPUs")
    return Band(statement, tuple(missing))


def band_lines(model: str, gpu: GpuSpec, is_moe: bool, weight_format: str) -> list[str]:
    """`capacity`/`bench` lines for one model on one GPU type, prefixed by both names."""
    band = band_for(gpu, "moe" if is_moe else "dense", weight_format)
    return [f"{model} on {gpu.name}: {line}" for line in band.lines()]
