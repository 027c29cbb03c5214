"""The joint planner on the fleets the old per-model sizing refused or fitted badly (issue
13), every example planned and rendered without GPUs, and refusals whose every printed fix,
applied, plans."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from planner_fleets import ROOT, fleet
from test_planner_oracle import PROFILES, _fleet, models_st, nodes_st

from inferplane.deploy import RenderOptions, render_files
from inferplane.errors import InferplaneError
from inferplane.planner import Plan, plan_fleet
from inferplane.planner.fixes import PlanRefused
from inferplane.spec import FleetSpec, load_fleet, parse_fleet
from inferplane.spec.problems import FleetValidationError

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
DEMO = ROOT / "examples" / "demo-sim.yaml"


def _demo(extra: str = "") -> FleetSpec:
    text = DEMO.read_text(encoding="utf-8")
    if extra:
        text = text.replace("    max_num_seqs: 64\n", "    max_num_seqs: 64\n" + extra)
    return parse_fleet(text, filename=str(DEMO))


def test_the_demo_fleet_plans_with_the_7b_on_two_cards_holding_its_32_requests() -> None:
    plan = plan_fleet(_demo())
    chat = plan.instances_of("qwen2.5-7b-instruct")[0]
    embed = plan.instances_of("qwen3-embedding-0.6b")[0]
    assert chat.tensor_parallel_size == 2 and chat.memory.max_concurrency >= 32
    assert embed.gpu_indices[0] in chat.gpu_indices  # shares one card, within budget
    for gpu in plan.gpus:
        assert gpu.used_gib <= gpu.budget_gib + 0.01


def test_colocate_with_does_not_shrink_the_7b_to_one_card() -> None:
    plan = plan_fleet(_demo("    placement: {colocate_with: [qwen2.5-7b-instruct]}\n"))
    chat = plan.instances_of("qwen2.5-7b-instruct")[0]
    assert chat.tensor_parallel_size == 2 and chat.memory.max_concurrency >= 32
    assert plan.totals.gpus_idle == 0
    assert plan.instances_of("qwen3-embedding-0.6b")[0].shares_gpu_with == [chat.id]


def test_an_8b_with_default_concurrency_and_an_embedding_share_one_h100() -> None:
    plan = plan_fleet(fleet("""
gpus:
  nodes: [{name: n1, gpu_type: H100, count: 1}]
models:
  - {name: qwen3-8b, source: Qwen--Qwen3-8B}
  - {name: embed, source: Qwen--Qwen3-Embedding-0.6B, task: embed}
"""))
    assert plan.totals.gpus_used == 1 and len(plan.gpus[0].instances) == 2
    assert plan.gpus[0].used_gib <= plan.gpus[0].budget_gib + 0.01
    assert all(i.memory.max_concurrency >= 1 and i.kv_cache_memory_bytes
               for i in plan.instances)


def test_explicit_values_are_constraints() -> None:
    plan = plan_fleet(fleet("""
gpus:
  nodes: [{name: n1, gpu_type: L4, count: 2}]
models:
  - {name: chat, source: Qwen--Qwen2.5-7B-Instruct, max_model_len: 8192, max_num_seqs: 32,
     tensor_parallel_size: 1, gpu_memory_utilization: 0.8}
"""))
    chat = plan.instances[0]
    assert chat.tensor_parallel_size == 1 and chat.gpu_memory_utilization == 0.8


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_plans_and_renders_without_gpus(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import inferplane.gpus.discovery as discovery

    def no_nvml(*_: object, **__: object) -> None:
        raise AssertionError("planning must not touch NVML here")

    monkeypatch.setattr(discovery, "discover_gpus", no_nvml)
    spec = load_fleet(path)
    plan = plan_fleet(spec, fleet_file=str(path))
    text = path.read_text(encoding="utf-8")
    multinode = any(i.spans_nodes for i in plan.instances)
    for target in ("k8s", "systemd") if multinode else ("k8s", "compose", "systemd"):
        files = render_files(spec, plan, target, RenderOptions(fleet_text=text))
        assert files


def test_an_endpoints_only_fleet_plans_and_renders_from_the_cli(tmp_path: Path) -> None:
    path = ROOT / "examples" / "endpoints-only.yaml"
    cmd = [sys.executable, "-m", "inferplane"]
    planned = subprocess.run([*cmd, "plan", str(path), "--json"], capture_output=True,
                             text=True, check=False)
    assert planned.returncode == 0, planned.stderr
    plan = Plan.model_validate_json(planned.stdout)
    assert plan.instances == [] and plan.gpus == [] and plan.endpoints
    assert any("nothing to place" in w for w in plan.warnings)
    for target in ("k8s", "compose", "systemd"):
        out = tmp_path / target
        rendered = subprocess.run([*cmd, "render", str(path), "--target", target, "--out",
                                   str(out)], capture_output=True, text=True, check=False)
        assert rendered.returncode == 0, rendered.stderr
        assert any("gateway" in str(p) for p in out.rglob("*"))


REFUSED = {
    "s4 on one server": (ROOT / "examples" / "s4-deepseek-qwen-mix.yaml").read_text(
        encoding="utf-8").replace("gpu_type: H100-SXM-80GB\n      count: 8",
                                  "gpu_type: H100-SXM-80GB\n      count: 2"),
    "too many replicas": """
gpus:
  nodes: [{name: n1, gpu_type: H100, count: 2}]
models:
  - {name: qwen3-8b, source: Qwen--Qwen3-8B, max_model_len: 8192, replicas: 3,
     gpu_memory_utilization: 0.9}
""",
    "too big": """
gpus:
  nodes: [{name: n1, gpu_type: L40S, count: 1}]
models:
  - {name: qwen3-32b, source: Qwen--Qwen3-32B, max_model_len: 32768}
""",
    "too long": """
gpus:
  nodes: [{name: n1, gpu_type: L4, count: 1}]
models:
  - {name: llama-8b, source: meta-llama--Llama-3.1-8B, max_model_len: 131072}
""",
    "pinned to a full node": """
gpus:
  nodes: [{name: a, gpu_type: L40S, count: 1}, {name: b, gpu_type: L40S, count: 2}]
models:
  - {name: q32, source: Qwen--Qwen3-32B-FP8, max_model_len: 8192, placement: {node: a},
     gpu_memory_utilization: 0.9}
  - {name: q8, source: Qwen--Qwen3-8B, max_model_len: 8192, placement: {node: a}}
""",
    "exclusive": """
gpus:
  nodes: [{name: a, gpu_type: H100, count: 1}]
models:
  - {name: q8, source: Qwen--Qwen3-8B, max_model_len: 8192, placement: {exclusive: true}}
  - {name: embed, source: Qwen--Qwen3-Embedding-0.6B, task: embed, max_model_len: 2048}
""",
}


def _text_fleet(text: str) -> FleetSpec:
    return parse_fleet(text, filename=str(ROOT / "examples" / "fleet.yaml"),
                       base_dir=ROOT / "tests" / "data" / "models")


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_every_printed_fix_plans_when_applied(name: str) -> None:
    text = REFUSED[name]
    if "s4" in name:
        spec = parse_fleet(text, filename=str(ROOT / "examples" / "s4.yaml"))
    else:
        spec = _text_fleet(text)
    with pytest.raises(PlanRefused) as caught:
        plan_fleet(spec, time_limit_s=1.0)
    refusal = caught.value
    assert refusal.fixes, refusal.render()
    assert refusal.fix == "; or ".join(f.text for f in refusal.fixes)
    for fix in refusal.fixes:
        plan_fleet(fix.apply(spec), time_limit_s=1.0)  # raises if the fix does not plan


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data(), nodes=nodes_st)
def test_fixes_of_random_refusals_plan(data: st.DataObject, nodes: list[tuple[str, int]]) -> None:
    try:
        spec = _fleet(nodes, data.draw(models_st(len(nodes))))
    except FleetValidationError:
        return
    try:
        plan_fleet(spec, profiles=PROFILES, time_limit_s=0.5)
    except PlanRefused as refusal:
        for fix in refusal.fixes:
            plan_fleet(fix.apply(spec), profiles=PROFILES, time_limit_s=0.5)
    except InferplaneError:
        pass
