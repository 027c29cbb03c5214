"""Golden files: rendered output for the seed scenarios, byte for byte.

Regenerate after an intended change with

    INFERPLANE_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_deploy_golden.py

and review the diff under tests/data/golden/. Output from real plans (`plan_fleet` on
examples/*.yaml) has the repository path replaced by /REPO.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_plans import llama70b_pp, mig, s0, s0_hami, s4

from inferplane.deploy import RenderOptions, check_dir, render_files
from inferplane.spec import load_fleet

REPO = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "data" / "golden"
UPDATE = os.environ.get("INFERPLANE_UPDATE_GOLDEN") == "1"
_PLAN_HASH = re.compile(r"(inferplane\.io/plan-sha256: )[0-9a-f]{16}")


def _compare(name: str, files: dict[str, str]) -> None:
    root = GOLDEN / name
    if UPDATE:
        for old in sorted(root.rglob("*"), reverse=True) if root.exists() else []:
            if old.is_file():
                old.unlink()
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text, encoding="utf-8")
        return
    assert root.is_dir(), f"no golden files for {name}; run with INFERPLANE_UPDATE_GOLDEN=1"
    have = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    assert have == set(files), f"{name}: file set differs"
    for rel, text in sorted(files.items()):
        assert (root / rel).read_text(encoding="utf-8") == text, f"{name}/{rel} differs"


@pytest.mark.parametrize("target", ["k8s", "compose", "systemd"])
@pytest.mark.parametrize("scenario", [s0, s4], ids=["s0", "s4"])
def test_hand_built_plans(scenario: Callable[[], Any], target: str) -> None:
    fleet, plan, text = scenario()
    files = render_files(fleet, plan, target, RenderOptions(fleet_text=text))
    _compare(f"{scenario.__name__}-{target}", files)


OPTION_SCENARIOS: dict[str, tuple[Callable[[], Any], dict[str, Any]]] = {
    "s4-pvc-volcano": (s4, {"weights": "pvc", "weights_storage_class": "nfs-ro",
                            "gang": "volcano"}),
    "s4-prewarm-kueue": (s4, {"weights": "prewarm", "gang": "kueue"}),
    "s0-hami": (s0_hami, {}),
    "mig": (mig, {}),
}


@pytest.mark.parametrize("name", sorted(OPTION_SCENARIOS))
def test_render_options(name: str) -> None:
    """Weights (P35), gang scheduling (P15), MIG/HAMi slices (S0): output and validity."""
    scenario, opts = OPTION_SCENARIOS[name]
    fleet, plan, text = scenario()
    files = render_files(fleet, plan, "k8s", RenderOptions(fleet_text=text, **opts))
    _compare(f"{name}-k8s", files)
    assert check_dir(GOLDEN / f"{name}-k8s") == []


@pytest.mark.parametrize("target", ["k8s", "systemd"])
def test_replicas_that_span_nodes(target: str) -> None:
    """Llama-3.1-70B over two L40S nodes per replica: a LeaderWorkerSet (P13, P15), or one
    systemd unit per rank in each node's directory."""
    fleet, plan, text = llama70b_pp()
    files = render_files(fleet, plan, target, RenderOptions(fleet_text=text))
    _compare(f"llama70b-pp-{target}", files)
    assert check_dir(GOLDEN / f"llama70b-pp-{target}") == []


@pytest.mark.parametrize("example", ["s0-l40s-colocated", "s4-deepseek-qwen-mix"])
def test_real_plans_from_examples(example: str) -> None:
    planner = pytest.importorskip("inferplane.planner.build")
    path = REPO / "examples" / f"{example}.yaml"
    fleet = load_fleet(path)
    plan = planner.plan_fleet(fleet, fleet_file=str(path))
    files = render_files(fleet, plan, "k8s",
                         RenderOptions(fleet_text=path.read_text(encoding="utf-8")))
    # The plan names the checkout's paths, so its hash does too: check it against the
    # rendered plan here, then compare the rest with the checkout's path masked.
    maps = yaml.safe_load_all(files["gateway/configmap.yaml"])
    plan_json = next(m for m in maps if m and "plan.json" in m["data"])["data"]["plan.json"]
    expected = hashlib.sha256(plan_json.encode()).hexdigest()[:16]
    assert f"inferplane.io/plan-sha256: {expected}" in files["gateway/deployment.yaml"]
    files = {rel: _PLAN_HASH.sub(r"\1<plan-hash>", text.replace(str(REPO), "/REPO"))
             for rel, text in files.items()}
    _compare(f"{example}-k8s", files)
    assert check_dir(GOLDEN / f"{example}-k8s") == []
