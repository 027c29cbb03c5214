"""docker compose and systemd renderings of the same plans."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_plans import s0, s4

from inferplane.deploy import RenderOptions, check_dir, render
from inferplane.deploy.compose import check_compose_file
from inferplane.deploy.systemd import quote


def _compose(tmp_path: Path, scenario: Any) -> Path:
    fleet, plan, text = scenario()
    render(fleet, plan, "compose", tmp_path, options=RenderOptions(fleet_text=text))
    return tmp_path


def test_compose_s0_colocated_services(tmp_path: Path) -> None:
    root = _compose(tmp_path, s0)
    assert check_dir(root) == []
    doc = yaml.safe_load((root / "l40s-node-1/compose.yaml").read_text())
    services = doc["services"]
    emb, llm = services["qwen3-embedding-0-6b-1"], services["qwen3-30b-a3b-0"]
    gpu = lambda s: s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]  # noqa: E731
    assert gpu(emb) == gpu(llm) == ["GPU-l40s-node-1-1"]  # the same card, by UUID
    assert llm["environment"]["CUDA_VISIBLE_DEVICES"] == "0"  # container-local index
    assert llm["depends_on"] == {"qwen3-embedding-0-6b-1": {"condition": "service_healthy"}}
    assert llm["ulimits"]["nofile"] == {"soft": 65536, "hard": 65536}
    assert llm["shm_size"] == "2gb"
    assert int(llm["healthcheck"]["start_period"].rstrip("s")) >= 300
    cc = llm["command"][llm["command"].index("--compilation-config") + 1]
    assert json.loads(cc) == {"cudagraph_capture_sizes": [1, 2, 4, 8]}
    assert services["gateway"]["ports"] == ["8000:8000"]
    assert (root / "l40s-node-1/fleet.yaml").is_file()


def test_compose_schema_rejects_unknown_keys(tmp_path: Path) -> None:
    root = _compose(tmp_path, s4)
    path = root / "h100-node-1/compose.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["services"]["qwen3-8b-0"]["shmsize"] = "2gb"
    path.write_text(yaml.safe_dump(doc))
    problems = check_compose_file(path, root)
    assert any("shmsize" in p.message for p in problems)


def test_systemd_quoting() -> None:
    assert quote("--port") == "--port"
    assert quote('{"a": [1, 2]}') == '"{\\"a\\": [1, 2]}"'
    assert quote("50%") == "50%%"
    assert quote("$HOME") == '"$$HOME"'


def test_systemd_units(tmp_path: Path) -> None:
    fleet, plan, text = s0()
    render(fleet, plan, "systemd", tmp_path, options=RenderOptions(fleet_text=text))
    node = tmp_path / "l40s-node-1"
    unit = (node / "inferplane-qwen3-30b-a3b-0.service").read_text()
    assert "Restart=always" in unit and "LimitNOFILE=65536" in unit
    assert "Environment=CUDA_VISIBLE_DEVICES=1" in unit
    assert "Requires=inferplane-qwen3-embedding-0-6b-1.service" in unit
    assert "curl -sf http://127.0.0.1:8101/health" in unit
    assert "TimeoutStopSec=330" in unit and "--shutdown-timeout 300" in unit
    target = (node / "inferplane.target").read_text()
    assert "inferplane-gateway.service" in target
    assert check_dir(tmp_path) == []


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_analyze_verify_accepts_units(tmp_path: Path) -> None:
    fleet, plan, text = s4()
    render(fleet, plan, "systemd", tmp_path, options=RenderOptions(fleet_text=text))
    for node in ("h100-node-1", "h200-node-1"):
        units = sorted(str(p) for p in (tmp_path / node).glob("*.service"))
        result = subprocess.run(["systemd-analyze", "verify", "--man=no", *units],
                                capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, result.stderr
    broken = tmp_path / "h100-node-1/inferplane-qwen3-8b-0.service"
    broken.write_text(broken.read_text().replace("Restart=always", "Restart=sometimes"))
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(broken)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert "restart specifier" in result.stderr
    messages = [p.render() for p in check_dir(tmp_path)]
    assert any("Restart" in m for m in messages), messages
