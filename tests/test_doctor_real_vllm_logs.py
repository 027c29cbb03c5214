"""`inferplane diagnose` on real vLLM's own failure logs (tests/data/diagnose/real-cpu-*.log).

Each log is what real vLLM 0.32.0 (its CPU build, a tiny local model) printed when started
with one operator error (scripts/capture_vllm_failures.py): --max-model-len above the model's
limit, a TP that does not divide the heads, an unknown flag, a missing model directory
(relative and absolute), a KV cache larger than the host's RAM, a port in use,
--structured-outputs-config without a backend; the healthy start is the near-miss.
SOURCES.yaml holds the finding each must produce; the port in use has no exact signature (the
generic layer's errno class names it: GENERIC below).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from inferplane.cli.main import _register_commands, app

_register_commands()
DATA = Path(__file__).parent / "data" / "diagnose"
REAL = [f for f in yaml.safe_load((DATA / "SOURCES.yaml").read_text())["fixtures"]
        if f["file"].startswith("real-cpu-")]
# Logs the generic layer classifies (no signature quotes them), in DATA/generic/.
GENERIC = {"real-cpu-port-in-use.log": "generic:port-in-use"}
runner = CliRunner()


def _diagnose(name: str) -> dict[str, Any]:
    path = DATA / "generic" / name if name in GENERIC else DATA / name
    result = runner.invoke(app, ["diagnose", str(path), "--json"])
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = json.loads(result.output)
    return doc


def test_every_captured_error_is_a_fixture() -> None:
    """The capture script's scenarios and the fixtures are the same list."""
    import importlib.util
    import sys

    path = Path(__file__).parents[1] / "scripts" / "capture_vllm_failures.py"
    spec = importlib.util.spec_from_file_location("capture_vllm_failures", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    captured = {f"real-cpu-{s.name}" + (".near" if s.healthy else "") + ".log"
                for s in module.SCENARIOS}
    assert captured == {f["file"] for f in REAL} | set(GENERIC)


@pytest.mark.parametrize("name", sorted(GENERIC))
def test_the_generic_layer_classifies_what_no_signature_quotes(name: str) -> None:
    doc = _diagnose(name)
    assert doc["findings"] == []
    assert doc["generic"]["id"] == GENERIC[name] and doc["generic"]["next_step"]


@pytest.mark.parametrize("fixture", [f for f in REAL if f["signature"]], ids=lambda f: f["file"])
def test_the_cli_names_the_cause_of_a_real_vllm_failure(fixture: dict[str, Any]) -> None:
    doc = _diagnose(fixture["file"])
    found = {f["id"]: f for f in doc["findings"]}
    assert list(found) == [fixture["signature"]], "exactly the expected finding"
    finding = found[fixture["signature"]]
    assert finding["cause"] and finding["fix"] and finding["evidence"]
    for key, value in (fixture.get("expect") or {}).items():
        assert finding["values"].get(key) == value, key
    if "version 0.32.0" in (DATA / fixture["file"]).read_text():  # the start banner
        assert doc["context"]["vllm_version"] == "0.32.0"  # (argparse errors come before it)


@pytest.mark.parametrize("fixture", [f for f in REAL if not f["signature"]],
                         ids=lambda f: f"{f['file']}-{f['not']}")
def test_a_healthy_real_start_has_no_finding(fixture: dict[str, Any]) -> None:
    """Every CPU-build log warns `... fd limit errors like OSError: [Errno 24] Too many open
    files`: a start that works must not read as that failure (nor as any other)."""
    assert _diagnose(fixture["file"])["findings"] == []
