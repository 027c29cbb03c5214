"""The CLI's entry point imports heavy modules only where they are used (issue 18, item 2):
`inferplane --help` and `version` in well under 0.5 s, `validate` under 1 s.

Checked by the set of modules `python -X importtime -m inferplane ...` reports, never by
the clock: the test fails when a command module imports one of HEAVY at module level.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Third-party packages that cost 50 ms to 1 s each, and our packages that pull them in.
HEAVY = (
    "ortools", "sqlalchemy", "alembic", "uvicorn", "aiohttp", "starlette", "httpx",
    "numpy", "pandas", "kubernetes", "kubernetes_validate", "jsonschema", "tokenizers",
    "prometheus_client", "redis", "asyncpg", "aiosqlite", "pynvml", "huggingface_hub",
    "matplotlib", "opentelemetry", "selenium",
    "inferplane.planner", "inferplane.estimator", "inferplane.gateway", "inferplane.store",
    "inferplane.tenancy", "inferplane.engines", "inferplane.deploy", "inferplane.console",
    "inferplane.monitoring", "inferplane.bench", "inferplane.doctor",
    "inferplane.runtime.runner", "inferplane.runtime.supervisor",
)  # fmt: skip
# Needed to read a fleet file, but not to print help.
SPEC = ("inferplane.spec", "inferplane.models")  # (pydantic: typer itself imports it)


def imported_modules(*args: str) -> set[str]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "inferplane", *args], capture_output=True,
        text=True, timeout=60, cwd=REPO, env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    assert "inferplane.cli.main" in names, proc.stderr[-2000:]
    return names


def _heavy(names: set[str], banned: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if any(n == b or n.startswith(b + ".") for b in banned))


@pytest.mark.parametrize("args", [["--help"], ["version"], ["up", "--help"], ["keys", "--help"]])
def test_help_and_version_import_nothing_heavy(args: list[str]) -> None:
    assert _heavy(imported_modules(*args), HEAVY + SPEC) == []


def test_validate_imports_the_spec_but_nothing_heavy() -> None:
    names = imported_modules("validate", "examples/demo.yaml")
    assert "inferplane.spec" in names
    # the spec reads vLLM version data from the planner's light modules; never OR-Tools
    light = ("inferplane.planner", "inferplane.estimator", "inferplane.engines")
    assert _heavy(names, tuple(b for b in HEAVY if b not in light)) == []


def test_sim_default_gpu_matches_the_simulator() -> None:
    from inferplane.cli.sim import DEFAULT_GPU
    from inferplane.sim.config import DEFAULT_GPU as SIM_DEFAULT_GPU

    assert DEFAULT_GPU == SIM_DEFAULT_GPU


def test_runtime_defaults_match_the_drain() -> None:
    from inferplane.runtime.defaults import DEFAULT_GRACE_PERIOD_S
    from inferplane.runtime.drain import DEFAULT_GRACE_PERIOD_S as DRAIN_DEFAULT

    assert DEFAULT_GRACE_PERIOD_S == DRAIN_DEFAULT
