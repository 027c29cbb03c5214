"""`inferplane gpus [--discover] [--json]` through the Typer app."""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from inferplane.cli import main as cli_main
from inferplane.errors import InferplaneError
from inferplane.gpus import GIB, known_gpus
from inferplane.gpus import discovery as discovery_mod
from inferplane.gpus.fake_nvml import FakeDevice, FakeNvml, FakeProcess

cli_main._register_commands()
runner = CliRunner()


def test_catalog_json_lists_every_spec() -> None:
    result = runner.invoke(cli_main.app, ["gpus", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [r["name"] for r in rows] == [s.name for s in known_gpus()]
    l40s = next(r for r in rows if r["name"] == "L40S")
    assert l40s["memory_gib"] == 44.39 and l40s["fp8_tflops"] == 733.0
    assert l40s["interconnect"] == "pcie" and l40s["compute_capability"] == "8.9"


def test_catalog_table_shows_cuda_memory() -> None:
    result = runner.invoke(cli_main.app, ["gpus"])
    assert result.exit_code == 0, result.output
    assert "H100-SXM-80GB" in result.output and "44.39" in result.output


def _fake_host(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    nvml = FakeNvml(
        [FakeDevice("NVIDIA H100 80GB HBM3", uuid="GPU-aaaa",
                    processes=[FakeProcess(99, 70 * GIB, "python3")]),
         FakeDevice("NVIDIA H100 80GB HBM3", uuid="GPU-bbbb")],
        links={(0, 1): "nvlink"},
    )
    monkeypatch.setattr(discovery_mod, "default_nvml", lambda: nvml)
    return nvml


def test_discover_json(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = _fake_host(monkeypatch)
    result = runner.invoke(cli_main.app, ["gpus", "--discover", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["driver_version"] == "550.54.15" and payload["cuda_driver_version"] == "12.4"
    assert [g["uuid"] for g in payload["gpus"]] == ["GPU-aaaa", "GPU-bbbb"]
    assert payload["gpus"][0]["catalog_name"] == "H100-SXM-80GB"
    assert payload["gpus"][0]["processes"] == [
        {"pid": 99, "used_bytes": 70 * GIB, "process_name": "python3"}]
    assert payload["topology"] == [["X", "nvlink"], ["nvlink", "X"]]
    assert nvml.sessions == 0


def test_discover_table(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_host(monkeypatch)
    result = runner.invoke(cli_main.app, ["gpus", "--discover"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "GPU-aaaa" in result.output and "99 python3" in result.output


def test_discover_without_nvml_raises_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(discovery_mod, "default_nvml",
                        lambda: FakeNvml([], init_error="Driver Not Loaded"))
    result = runner.invoke(cli_main.app, ["gpus", "--discover"])
    assert isinstance(result.exception, InferplaneError)
    assert "Driver Not Loaded" in str(result.exception)


def test_main_exits_2_without_nvml(monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(discovery_mod, "default_nvml",
                        lambda: FakeNvml([], init_error="Driver Not Loaded"))
    monkeypatch.setattr(sys, "argv", ["inferplane", "gpus", "--discover"])
    with pytest.raises(SystemExit) as info:
        cli_main.main()
    assert info.value.code == 2
    assert "Driver Not Loaded" in capsys.readouterr().err
