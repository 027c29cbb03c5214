"""`planning.objective`: `utilize` (owned GPUs, the default) against `min_gpus` (rented;
`inferplane capacity`), on the issue's two-node H100 fleet, and the audit's four misses
as regression tests (issue 25)."""

from __future__ import annotations

from pathlib import Path

import pytest
from planner_fleets import MODELS, fleet

from inferplane.errors import InferplaneError
from inferplane.planner import Plan, plan_fleet
from inferplane.planner.placement import alike

TWO_NODES = """
gpus:
  nodes:
    - {name: a, gpu_type: H100, count: 8}
    - {name: b, gpu_type: H100, count: 8}
models:
  - {name: llama-70b, source: meta-llama--Llama-3.1-70B-Instruct, replicas: 2, TP70
     max_model_len: 32768, max_num_seqs: 64, aliases: [big]}
  - {name: qwen3-32b, source: Qwen--Qwen3-32B, replicas: 2, TP32 max_model_len: 32768,
     max_num_seqs: 64}
  - {name: qwen2-5-7b, source: Qwen--Qwen2.5-7B-Instruct, replicas: 3, TP7
     max_model_len: 32768, max_num_seqs: 64, placement: {node: b}}
  - {name: embed, source: Qwen--Qwen3-Embedding-0.6B, task: embed, replicas: 3,
     max_model_len: 8192, placement: {colocate_with: [qwen2-5-7b]}}
"""
PINNED = (TWO_NODES.replace("TP70", "tensor_parallel_size: 4,")
          .replace("TP32", "tensor_parallel_size: 2,").replace("TP7", "tensor_parallel_size: 1,"))
AUTO = TWO_NODES.replace("TP70", "").replace("TP32", "").replace("TP7", "")


def _short(plan: Plan) -> list[str]:
    return [i.id for i in plan.instances if i.memory.max_concurrency < i.max_num_seqs
            and i.model != "embed"]


def _alike_per_model(plan: Plan) -> None:
    for model in {i.model for i in plan.instances}:
        tokens = [float(i.memory.kv_cache_tokens) for i in plan.instances_of(model)]
        assert alike(tokens), (model, tokens)


def test_utilize_leaves_no_gpu_idle_that_a_short_replica_could_use() -> None:
    plan = plan_fleet(fleet(PINNED))
    assert plan.objective == "utilize"
    assert _short(plan)  # no shape meets 64 x 32K: every replica is short
    # Every generation model's TP is pinned (2x4 + 2x2 + 3x1 = 15 GPUs) and the embeddings
    # must share the 7Bs' cards: the 16th GPU has no replica that could take it.
    assert plan.totals.gpus_idle == 16 - 15
    _alike_per_model(plan)
    for inst in plan.instances:
        if inst.model != "embed":
            assert inst.gpu_memory_utilization >= 0.85, inst.id  # a card of its own
            assert len(inst.shares_gpu_with) <= 1  # nothing shares a card three ways


def test_without_the_tp_lines_every_gpu_is_used_and_replicas_are_alike() -> None:
    plan = plan_fleet(fleet(AUTO))
    assert _short(plan)
    assert plan.totals.gpus_idle == 0
    _alike_per_model(plan)
    assert {i.tensor_parallel_size for i in plan.instances_of("qwen2-5-7b")} == {2}


def test_min_gpus_is_the_capacity_planners_objective() -> None:
    """The audit's plan: fewest GPUs first, four idle next to starved replicas."""
    utilize = plan_fleet(fleet(PINNED))
    rented = plan_fleet(fleet(PINNED), objective="min_gpus")
    assert rented.objective == "min_gpus" and rented.totals.gpus_idle >= 4
    assert rented.totals.gpus_used < utilize.totals.gpus_used
    held = {p: sum(i.memory.max_concurrency for i in plan.instances)
            for p, plan in (("utilize", utilize), ("min_gpus", rented))}
    assert held["utilize"] > 2 * held["min_gpus"]
    # the min_gpus plan says its 70B replicas are not alike, and why
    assert any("llama-70b: its replicas hold" in w and "min_gpus" in w for w in rented.warnings)
    by_file = plan_fleet(fleet(PINNED + "planning: {objective: min_gpus}\n"))
    assert by_file.objective == "min_gpus"
    assert [i.gpu_indices for i in by_file.instances] == [i.gpu_indices for i in rented.instances]


def test_p09_is_one_line_per_model_with_the_number_it_holds() -> None:
    plan = plan_fleet(fleet(AUTO))
    p09 = [w for w in plan.warnings if w.startswith("P09")]
    models = {i.model for i in plan.instances if i.id in _short(plan)}
    assert len(p09) == len(models), p09
    for model in models:
        (line,) = [w for w in p09 if w.startswith(f"P09: {model}:")]
        held = plan.instances_of(model)[0].memory.max_concurrency
        assert f"{held:.1f}" in line and "max_num_seqs 64" in line
    assert not any("embed" in w for w in p09)  # default max_num_seqs: a cap, not a demand


def test_a_small_model_takes_tp_2_only_where_it_holds_more_and_gets_no_tp_advice() -> None:
    text = """
gpus: {nodes: [{name: a, gpu_type: H100, count: 2}]}
models:
  - {name: embed, source: Qwen--Qwen3-Embedding-0.6B, task: embed, max_model_len: 32768,
     max_num_seqs: 2048}
"""
    rented = plan_fleet(fleet(text), objective="min_gpus")
    assert [i.tensor_parallel_size for i in rented.instances] == [1]
    plan = plan_fleet(fleet(text))  # utilize: TP 2 holds twice the KV, and it says so
    (inst,) = plan.instances
    assert inst.tensor_parallel_size == 2
    (why,) = [w for w in plan.warnings if w.startswith("embed: TP 2 although")]
    assert f"holds {inst.memory.max_concurrency:.1f}" in why
    for p in (plan, rented):
        (p09,) = [w for w in p.warnings if w.startswith("P09")]
        assert "TP " not in p09.split("the rest queue")[1], p09
        assert "more replicas" in p09


# --- the audit's four misses ------------------------------------------------------------


def test_colocation_on_vllm_before_0_11_uses_shares_and_sequential_start() -> None:
    text = """
engine: {version: 0.10.2}
gpus: {nodes: [{name: a, gpu_type: L40S, count: 1}]}
models:
  - {name: qwen3-8b, source: Qwen--Qwen3-8B, max_model_len: 8192, max_num_seqs: 8}
  - {name: embed, source: Qwen--Qwen3-Embedding-0.6B, task: embed, max_model_len: 4096,
     placement: {colocate_with: [qwen3-8b]}}
"""
    plan = plan_fleet(fleet(text))  # was: an invented extra_args error
    eight, embed = plan.instances
    assert eight.shares_gpu_with == [embed.id] and embed.start_after == [eight.id]
    for inst in plan.instances:
        assert inst.kv_cache_memory_bytes is None
        assert "--kv-cache-memory-bytes" not in inst.argv
    assert sum(i.gpu_memory_utilization for i in plan.instances) <= 0.95


def test_tp_for_a_model_sharing_with_an_embedding_without_max_num_seqs() -> None:
    text = """
gpus: {nodes: [{name: a, gpu_type: L4, count: 2}]}
models:
  - {name: qwen2-5-7b, source: Qwen--Qwen2.5-7B-Instruct, max_model_len: 8192,
     max_num_seqs: 32}
  - {name: embed, source: Qwen--Qwen3-Embedding-0.6B, task: embed, max_model_len: 8192,
     placement: {colocate_with: [qwen2-5-7b]}}
"""
    for objective in ("utilize", "min_gpus"):
        plan = plan_fleet(fleet(text), objective=objective)  # type: ignore[arg-type]
        (seven,) = plan.instances_of("qwen2-5-7b")
        assert seven.tensor_parallel_size == 2 and seven.memory.max_concurrency >= 32


def test_colocate_with_a_model_with_fewer_replicas_shares_its_card() -> None:
    text = """
gpus: {nodes: [{name: a, gpu_type: L40S, count: 2}]}
models:
  - {name: embed, source: Qwen--Qwen3-Embedding-0.6B, task: embed, max_model_len: 4096}
  - {name: qwen3-8b, source: Qwen--Qwen3-8B, max_model_len: 8192, max_num_seqs: 8,
     replicas: 2, placement: {colocate_with: [embed]}}
"""
    plan = plan_fleet(fleet(text))  # was: refused ("must share a GPU with embed")
    (embed,) = plan.instances_of("embed")
    eights = plan.instances_of("qwen3-8b")
    assert sum(embed.id in i.shares_gpu_with for i in eights) == 1
    assert eights[0].gpu_indices != eights[1].gpu_indices


def test_tp_larger_than_any_node_names_the_node_sizes_and_the_pp_fix() -> None:
    text = """
gpus:
  nodes:
    - {name: a, gpu_type: H100, count: 8}
    - {name: b, gpu_type: H100, count: 8}
models:
  - {name: llama-70b, source: meta-llama--Llama-3.1-70B-Instruct, tensor_parallel_size: 16,
     max_model_len: 8192}
"""
    with pytest.raises(InferplaneError) as caught:
        plan_fleet(fleet(text))
    err = caught.value
    assert "tensor_parallel_size 16 needs 16" in err.message and "node has 8" in err.message
    assert err.field == "models.llama-70b.tensor_parallel_size" and err.value == 16
    rendered = err.render()
    assert "pipeline_parallel_size: 2" in rendered and "do not fit next to" not in rendered


def test_an_unknown_objective_names_the_field() -> None:
    with pytest.raises(Exception, match="objective"):
        fleet(AUTO + "planning: {objective: cheapest}\n")


def test_the_demo_plans_with_the_one_warning_its_file_explains() -> None:
    """Issue 28/23: the shipped demo's own plan, and the README's words for it."""
    from planner_fleets import ROOT

    from inferplane.spec import load_fleet

    demo = ROOT / "examples" / "demo.yaml"
    plan = plan_fleet(load_fleet(demo))
    (warning,) = plan.warnings
    assert warning.startswith("P09: qwen3-32b-fp8: 2 of its 2 replicas hold")
    assert "keeps one warning on purpose (P09)" in demo.read_text()
    on = {i.id: i.gpu_indices for i in plan.instances}
    assert {tuple(on["qwen3-32b-fp8-0"]), tuple(on["qwen3-32b-fp8-1"])} == {(0,), (1,)}
    assert on["qwen2.5-7b-instruct-0"] == [2]
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "each 32B replica a card with one embedding replica, cards 0 and 1, and the 7B " \
           "card 2" in readme


def test_alike_replicas_may_need_a_node_greedy_left_empty() -> None:
    """Found by benchmarks/plan_quality.py: every demand met (a fixed utilization), so the
    solver only polished greedy's nodes - an L4 and an H100, 2.8 vs 12.3 requests - while
    the H100 and an A100 hold both alike."""
    text = """
gpus:
  nodes:
    - {name: node-0, gpu_type: L4, count: 1}
    - {name: node-1, gpu_type: H100, count: 1}
    - {name: node-2, gpu_type: A100-80GB, count: 2}
models:
  - {name: embed, source: Qwen--Qwen3-Embedding-0.6B, task: embed, replicas: 2,
     max_model_len: 16384, max_num_seqs: 64, tensor_parallel_size: 1,
     gpu_memory_utilization: 0.3}
"""
    plan = plan_fleet(fleet(text))
    assert {i.node for i in plan.instances} == {"node-1", "node-2"}
    _alike_per_model(plan)
    assert not any("more than 25% apart" in w for w in plan.warnings)


def test_plan_cli_prints_the_objective_and_takes_one(tmp_path: Path) -> None:
    import json
    import os
    import subprocess
    import sys

    path = tmp_path / "fleet.yaml"
    path.write_text(PINNED.replace("source: ", f"source: {MODELS}/"), encoding="utf-8")
    env = {**os.environ, "COLUMNS": "200", "INFERPLANE_STATE_DIR": str(tmp_path / "state")}

    def plan(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "inferplane", "plan", str(path), *args],
                              capture_output=True, text=True, env=env, timeout=300)

    rented = plan("--objective", "min_gpus", "--out", str(tmp_path / "plan.json"),
                  "--time-limit-s", "1")
    assert rented.returncode == 0, rented.stderr
    assert "objective min_gpus" in rented.stdout
    assert json.loads((tmp_path / "plan.json").read_text())["objective"] == "min_gpus"
    bad = plan("--objective", "cheap")
    assert bad.returncode == 2 and "--objective" in bad.stdout + bad.stderr
