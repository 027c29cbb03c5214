"""Adding and removing replicas of a running fleet's plan without moving what runs (the
autoscaler's placement)."""

from __future__ import annotations

import pytest
from planner_fleets import ROOT, fleet

from inferplane.errors import InferplaneError
from inferplane.planner import Plan, plan_fleet
from inferplane.planner.incremental import add_replicas, remove_replicas
from inferplane.spec import load_fleet

S4 = ROOT / "examples" / "s4-deepseek-qwen-mix.yaml"

SHARED = """
gpus:
  nodes: [{name: n1, gpu_type: H100, count: 2}]
models:
  - {name: q8, source: Qwen--Qwen3-8B, max_model_len: 8192, gpu_memory_utilization: 0.6}
  - {name: embed, source: Qwen--Qwen3-Embedding-0.6B, task: embed, max_model_len: 2048,
     max_num_seqs: 8, replicas: 0}
"""


def _within_budget(plan: Plan) -> None:
    for gpu in plan.gpus:
        assert gpu.used_gib <= gpu.budget_gib + 0.011, gpu
    assert len({i.port for i in plan.instances}) == len(plan.instances)
    assert len({i.id for i in plan.instances}) == len(plan.instances)


def test_new_replicas_go_to_free_room_and_nothing_running_moves() -> None:
    spec = load_fleet(S4)
    before = plan_fleet(spec)
    after = add_replicas(spec, before, "qwen3-8b", 2)
    _within_budget(after)
    old = {i.id: i for i in before.instances}
    for inst in after.instances:
        if inst.id in old:
            assert inst.model_copy(update={"shares_gpu_with": old[inst.id].shares_gpu_with}) \
                == old[inst.id]
    added = [i for i in after.instances if i.id not in old]
    assert sorted(i.id for i in added) == ["qwen3-8b-1", "qwen3-8b-2"]
    assert all(i.node == "h100-node-1" for i in added)
    taken = {(i.node, g) for i in before.instances for g in i.gpu_indices}
    assert not any((i.node, g) in taken for i in added for g in i.gpu_indices)  # free cards
    assert after.totals.gpus_used == before.totals.gpus_used + 2


def test_a_replica_added_next_to_a_running_instance_gets_a_kv_pool_and_starts_after_it(
) -> None:
    spec = fleet(SHARED.replace("count: 2", "count: 1"))
    before = plan_fleet(spec)
    after = add_replicas(spec, before, "embed", 1)
    _within_budget(after)
    embed = after.instances_of("embed")[0]
    q8 = after.instances_of("q8")[0]
    assert embed.gpu_indices == q8.gpu_indices
    assert embed.kv_cache_memory_bytes and embed.start_after == [q8.id]
    assert q8.shares_gpu_with == [embed.id]
    assert q8.gpu_memory_utilization == 0.6 and q8.argv == before.instances[0].argv


def test_removed_replicas_free_their_room_and_numbers_are_reused() -> None:
    spec = load_fleet(S4)
    grown = add_replicas(spec, plan_fleet(spec), "qwen3-8b", 2)
    shrunk = remove_replicas(spec, grown, ["qwen3-8b-1"])
    assert [i.id for i in shrunk.instances_of("qwen3-8b")] == ["qwen3-8b-0", "qwen3-8b-2"]
    assert shrunk.totals.gpus_used == grown.totals.gpus_used - 1
    again = add_replicas(spec, shrunk, "qwen3-8b", 1)
    assert "qwen3-8b-1" in {i.id for i in again.instances}
    _within_budget(again)


def test_replicas_that_do_not_fit_are_refused_with_the_numbers() -> None:
    spec = fleet(SHARED.replace("count: 2", "count: 1"))
    before = plan_fleet(spec)
    with pytest.raises(InferplaneError) as caught:
        add_replicas(spec, before, "q8", 1)  # replicas of one model never share a card
    assert caught.value.field == "models.q8.replicas" and "TP 1" in caught.value.message
    with pytest.raises(InferplaneError):
        remove_replicas(spec, before, ["nope-0"])


def test_replicas_added_one_by_one_fill_the_cards_within_budget() -> None:
    spec = fleet(SHARED)
    plan = plan_fleet(spec)
    added = 0
    while added < 8:
        try:
            plan = add_replicas(spec, plan, "embed", 1)
        except InferplaneError:
            break
        added += 1
        _within_budget(plan)
    assert added == 2  # one per card: replicas of one model never share a GPU


def test_the_plan_reports_models_that_can_only_take_turns() -> None:
    swap = """
gpus:
  nodes: [{name: n1, gpu_type: L4, count: 1}]
models:
  - {name: day, source: Qwen--Qwen3-8B, max_model_len: 4096, max_num_seqs: 4}
  - {name: night, source: Qwen--Qwen3-8B, max_model_len: 4096, max_num_seqs: 4, replicas: 0}
  - {name: embed, source: Qwen--Qwen3-Embedding-0.6B, task: embed, max_model_len: 2048,
     replicas: 0}
scaling:
  models:
    day: {min_replicas: 0, max_replicas: 1}
    night: {min_replicas: 0, max_replicas: 1}
    embed: {min_replicas: 0, max_replicas: 1}
"""
    plan = plan_fleet(fleet(swap))
    swaps = [w for w in plan.warnings if w.startswith("swap:")]
    # Two 8B models never fit one L4 together; the small embedding fits next to either.
    assert swaps == [w for w in swaps if "day and night" in w] and len(swaps) == 1
    bigger = plan_fleet(fleet(swap.replace("count: 1", "count: 2")))
    assert not [w for w in bigger.warnings if w.startswith("swap:")]


def test_a_new_replica_takes_an_empty_card_before_a_busy_one() -> None:
    """Owned GPUs (utilize): the scale-up (or a start from zero) goes to the least
    contended card; a plan for the fewest GPUs (min_gpus) still packs it next to q8."""
    spec = fleet(SHARED)
    plan = plan_fleet(spec)
    (q8,) = plan.instances
    (embed,) = add_replicas(spec, plan, "embed", 1).instances_of("embed")
    assert embed.gpu_indices != q8.gpu_indices and not embed.shares_gpu_with
    rented = plan_fleet(spec, objective="min_gpus")
    (packed,) = add_replicas(spec, rented, "embed", 1).instances_of("embed")
    assert packed.gpu_indices == rented.instances[0].gpu_indices


def test_models_started_from_zero_are_not_reported_as_a_swap_when_both_fit() -> None:
    """`up` printed "batch and chat cannot be awake together" with cards idle: placing the
    second model failed on the first one's zero replicas in the fleet, not on room."""
    from inferplane.scaling.placement import not_awake_together, planner_placer

    text = """
gpus:
  nodes: [{name: n1, gpu_type: L4, count: 4}]
models:
  - {name: chat, source: Qwen--Qwen3-8B, max_model_len: 4096, max_num_seqs: 4}
  - {name: batch, source: Qwen--Qwen3-8B, max_model_len: 4096, max_num_seqs: 4}
scaling:
  models:
    chat: {min_replicas: 0, max_replicas: 1}
    batch: {min_replicas: 0, max_replicas: 1}
"""
    spec = fleet(text)
    plan = plan_fleet(spec)
    assert plan.instances == [] and not [w for w in plan.warnings if w.startswith("swap:")]
    assert not_awake_together(spec, plan, ["batch", "chat"], planner_placer()) == []
    one = fleet(text.replace("count: 4", "count: 1"))
    assert not_awake_together(one, plan_fleet(one), ["batch", "chat"],
                              planner_placer()) == [("batch", "chat")]
