"""Fleet-file builders shared by the planner tests (sources point at tests/data/models)."""

from __future__ import annotations

from pathlib import Path

from inferplane.spec import FleetSpec, parse_fleet

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "tests" / "data" / "models"


def fleet(text: str) -> FleetSpec:
    return parse_fleet(text, filename=str(ROOT / "tests" / "fleet.yaml"), base_dir=MODELS)
