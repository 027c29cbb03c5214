"""Replicas that span nodes (pipeline parallelism): vLLM's layer split, memory per stage,
placement on distinct nodes, what the planner says when they do not fit, and `up`."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from planner_fleets import MODELS, ROOT, fleet

from inferplane.engines.vllm.versions import DEFAULT_VLLM_VERSION
from inferplane.errors import InferplaneError
from inferplane.estimator.memory import estimate_memory
from inferplane.estimator.overheads import sampler_bytes_per_logit
from inferplane.estimator.pipeline import layer_split, stage_profile, stages
from inferplane.estimator.types import EngineSettings, MemoryEstimate
from inferplane.gpus import lookup_gpu
from inferplane.gpus.spec import GIB
from inferplane.models import load_profile
from inferplane.planner import plan_fleet
from inferplane.planner.plan import LEADER_ADDRESS_TOKEN, Plan
from inferplane.runtime.vllm_fleet import plan_vllm_instances
from inferplane.spec import FleetValidationError, load_fleet

LLAMA_70B = MODELS / "meta-llama--Llama-3.1-70B-Instruct"
EXAMPLE = ROOT / "examples" / "multinode-70b.yaml"

# --- the layer split (vllm/distributed/utils.py: get_pp_indices) ---------------------------


def test_layer_split_matches_vllm() -> None:
    assert layer_split(80, 2) == [40, 40]
    # 80 = 3 x 26 + 2: the remainder goes to the stages before the last, from the back.
    assert layer_split(80, 3) == [27, 27, 26]
    assert layer_split(61, 4) == [15, 15, 16, 15]  # DeepSeek-V3: 61 = 4 x 15 + 1
    assert layer_split(10, 4) == [2, 3, 3, 2]
    assert layer_split(80, 2, (30, 50)) == [30, 50]  # VLLM_PP_LAYER_PARTITION


def test_layer_split_refuses_what_vllm_refuses() -> None:
    with pytest.raises(InferplaneError, match="exceeds the model's 2 decoder layers"):
        layer_split(2, 3)
    with pytest.raises(InferplaneError, match="must give 2 positive layer counts summing to 80"):
        layer_split(80, 2, (40, 41))


@given(layers=st.integers(1, 200), pp=st.integers(1, 16))
def test_layer_split_property(layers: int, pp: int) -> None:
    if pp > layers:
        return
    counts = layer_split(layers, pp)
    assert len(counts) == pp and sum(counts) == layers
    assert max(counts) - min(counts) <= 1 and min(counts) >= 1
    assert counts[-1] == layers // pp  # the last stage (final norm, LM head) never gets more
    split = stages(layers, pp)
    assert split[0].start_layer == 0 and split[-1].end_layer == layers
    assert all(a.end_layer == b.start_layer for a, b in itertools.pairwise(split))


def test_stage_profiles_share_out_the_parameters() -> None:
    profile = load_profile(MODELS / "deepseek-ai--DeepSeek-V3")
    parts = [stage_profile(profile, s) for s in stages(profile.num_layers, 4)]
    assert [p.num_layers for p in parts] == [15, 15, 16, 15]
    assert sum(p.num_moe_layers for p in parts) == profile.num_moe_layers
    assert parts[0].num_moe_layers == 15 - 3  # first_k_dense_replace: 3 dense layers
    assert [p.params.embedding > 0 for p in parts] == [True, False, False, False]
    assert [p.params.lm_head > 0 for p in parts] == [False, False, False, True]
    for role in ("linear", "experts", "other"):
        total = getattr(profile.params, role)
        assert total - len(parts) < sum(getattr(p.params, role) for p in parts) <= total


# --- memory per stage, by hand from config.json -------------------------------------------


def _llama_estimate(**fields: object) -> MemoryEstimate:
    settings = EngineSettings(tensor_parallel_size=2, pipeline_parallel_size=2,
                              max_model_len=8192, gpu_memory_utilization=0.9)
    settings = dataclasses.replace(settings, **fields)  # type: ignore[arg-type]
    return estimate_memory(load_profile(LLAMA_70B), settings, gpu=lookup_gpu("L40S"))


def test_llama_70b_tp2_pp2_weights_and_kv_per_stage_by_hand() -> None:
    c = json.loads((LLAMA_70B / "config.json").read_text())
    h, inter, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    kv_dim = c["num_key_value_heads"] * h // c["num_attention_heads"]
    tp, pp, bf16 = 2, 2, 2
    per_layer = h * (h + 2 * kv_dim) + h * h + 3 * h * inter  # q, k, v, o + gate, up, down
    norms = 2 * h * layers + h  # two per layer + the final one, spread evenly over stages
    stage_layers = layers // pp
    embedding = c["vocab_size"] * h * bf16 // tp  # 128256 is a multiple of 64 x TP: no pad
    rope = c["max_position_embeddings"] * (h // c["num_attention_heads"]) * bf16
    expected = (embedding + stage_layers * per_layer * bf16 // tp
                + norms * stage_layers // layers * bf16 + rope)
    assert expected == 35_311_067_136  # 32.89 GiB on each GPU of either stage
    est = _llama_estimate()
    assert [(r.start_layer, r.end_layer) for r in est.ranks] == [(0, 40), (40, 80)]
    for rank in est.ranks:  # stage 0 holds the embedding, stage 1 the (as large) LM head
        assert rank.weights_gib == round(expected / GIB, 4)
        # K and V of this stage's 40 layers, 8 KV heads / TP 2, head_dim 128, bf16
        assert rank.kv_bytes_per_token_per_gpu == stage_layers * 2 * 4 * 128 * bf16 == 81_920
        page = 16 * 2 * 4 * 128 * bf16 * stage_layers  # one block of 16 tokens, 40 layers
        assert abs(rank.num_gpu_blocks - int(rank.kv_cache_gib * GIB) // page) <= 1
    assert est.kv_bytes_per_token == layers * 2 * 8 * 128 * bf16  # the whole model
    # Only the last stage runs the sampler warm-up (256 requests x vocabulary x the
    # release's bytes per logit) on top of the kept hidden states; the first stage's peak
    # is its forward pass.
    sampler = 256 * c["vocab_size"] * sampler_bytes_per_logit(DEFAULT_VLLM_VERSION)
    hidden_kept = est.max_num_batched_tokens * h * bf16
    forward_gib = est.ranks[0].activation_gib
    assert est.ranks[1].activation_gib == pytest.approx(
        max(forward_gib, (hidden_kept + sampler) / GIB), abs=2e-4)
    # vLLM gives every stage the smallest stage's blocks: the replica's capacity is stage 1's.
    assert est.worst_rank == 1 and est.num_gpu_blocks == est.ranks[1].num_gpu_blocks
    assert est.num_gpu_blocks == min(r.num_gpu_blocks for r in est.ranks)
    assert est.max_concurrency == round(est.num_gpu_blocks / math.ceil(8192 / 16), 2)
    assert est.kv_cache_tokens == int(est.num_gpu_blocks / 512 * 8192)
    assert est.weights_gib == est.ranks[1].weights_gib and est.fits


def test_one_stage_is_the_single_node_estimate() -> None:
    est = _llama_estimate(pipeline_parallel_size=1, tensor_parallel_size=4)
    assert est.ranks == [] and est.worst_rank == 0 and est.pipeline_parallel_size == 1
    # TP 4 on one node and TP 2 on each of 2 nodes hold the same KV per GPU per token.
    assert est.kv_bytes_per_token_per_gpu == 81_920


def test_layer_partition_moves_the_bottleneck() -> None:
    est = _llama_estimate(pipeline_layer_partition=(30, 50))
    assert [(r.start_layer, r.end_layer) for r in est.ranks] == [(0, 30), (30, 80)]
    assert est.worst_rank == 1 and est.kv_bytes_per_token_per_gpu == 50 * 2 * 4 * 128 * 2
    assert est.ranks[1].weights_gib > est.ranks[0].weights_gib


def test_tied_embeddings_sit_on_the_first_and_the_last_stage() -> None:
    profile = load_profile(MODELS / "google--gemma-2-9b-it")
    assert profile.tie_word_embeddings
    first, last = (stage_profile(profile, s) for s in stages(profile.num_layers, 2))
    assert first.params.embedding == last.params.embedding == profile.params.embedding
    # Hybrid sliding-window layers keep their kinds in each stage (KV groups per stage).
    assert first.layer_attention + last.layer_attention == profile.layer_attention


def test_stage_too_heavy_names_the_stage() -> None:
    est = _llama_estimate(tensor_parallel_size=1)
    assert not est.fits
    assert any("per GPU (pipeline stage 0)" in e and "pipeline_parallel_size" in e
               for e in est.errors)


# --- the planner ---------------------------------------------------------------------------

NODES = """
gpus:
  nodes:
    - {name: a, gpu_type: L40S, count: 2, interconnect: pcie, network_interface: eth1}
    - {name: b, gpu_type: L40S, count: 2, interconnect: pcie, network_interface: eth1}
    - {name: c, gpu_type: L40S, count: 2, interconnect: pcie}
"""


def _llama(pp: object = 2, *, replicas: int = 1, extra: str = "") -> str:
    return (f"  - {{name: llama, source: meta-llama--Llama-3.1-70B-Instruct, max_model_len: "
            f"8192, max_num_seqs: 8, pipeline_parallel_size: {pp}, replicas: {replicas}"
            f"{extra}}}\n")


def test_example_places_one_replica_on_two_distinct_nodes() -> None:
    plan = plan_fleet(load_fleet(EXAMPLE))
    inst = plan.instances_of("llama-3.1-70b-instruct")[0]
    assert inst.spans_nodes and inst.pipeline_parallel_size == 2
    assert [r.rank for r in inst.ranks] == [0, 1]
    assert [r.node for r in inst.ranks] == ["l40s-server-1", "l40s-server-2"]
    assert [r.layers for r in inst.ranks] == [[0, 40], [40, 80]]
    leader = inst.ranks[0]
    assert (inst.node, inst.gpu_indices, inst.argv, inst.env) == (
        leader.node, leader.gpu_indices, leader.argv, leader.env)
    for rank in inst.ranks:
        assert rank.argv[rank.argv.index("--master-addr") + 1] == LEADER_ADDRESS_TOKEN
        assert rank.env["CUDA_VISIBLE_DEVICES"] == "0,1"
        assert rank.env["NCCL_P2P_DISABLE"] == "1"  # PCIe TP group inside the node
        assert "NCCL_SOCKET_IFNAME" not in rank.env  # the inventory names no interface
        assert rank.memory is not None and rank.memory.weights_gib == pytest.approx(32.886)
    # Every GPU of every stage is in the plan's GPU list, and holds nothing else (P15).
    for rank in inst.ranks:
        for index in rank.gpu_indices:
            gpu = next(g for g in plan.gpus if (g.node, g.index) == (rank.node, index))
            assert gpu.instances == [inst.id] and gpu.used_gib <= gpu.budget_gib
    assert plan.totals.gpus_used == 5
    other = plan.instances_of("qwen3-8b")[0]
    assert other.node == "l40s-server-3" and not other.ranks
    assert Plan.model_validate_json(plan.model_dump_json()) == plan


def test_network_interface_from_the_inventory_becomes_nccl_env() -> None:
    plan = plan_fleet(fleet(NODES + "models:\n" + _llama()))
    inst = plan.instances[0]
    for rank in inst.ranks:
        assert rank.env["NCCL_SOCKET_IFNAME"] == rank.env["GLOO_SOCKET_IFNAME"] == "eth1"
    assert {r.node for r in inst.ranks} == {"a", "b"}


def test_auto_spans_nodes_only_when_one_node_cannot_hold_a_replica() -> None:
    small = plan_fleet(fleet(NODES + "models:\n" + _llama("auto")))
    assert small.instances[0].pipeline_parallel_size == 2
    big = """
gpus:
  nodes:
    - {name: a, gpu_type: L40S, count: 4, interconnect: pcie}
    - {name: b, gpu_type: L40S, count: 4, interconnect: pcie}
models:
"""
    plan = plan_fleet(fleet(big + _llama("auto")))
    inst = plan.instances[0]
    assert (inst.pipeline_parallel_size, inst.tensor_parallel_size, inst.ranks) == (1, 4, [])


def test_one_node_of_the_type_is_refused_and_explained() -> None:
    one = """
gpus:
  nodes:
    - {name: a, gpu_type: L40S, count: 2, interconnect: pcie}
models:
"""
    with pytest.raises(FleetValidationError, match="needs 2 nodes"):
        fleet(one + _llama(2))
    with pytest.raises(InferplaneError) as caught:
        plan_fleet(fleet(one + _llama("auto")))
    assert "llama does not fit" in caught.value.message
    assert "pipeline_parallel_size" not in (caught.value.fix or "")  # no second node to offer


def test_default_single_node_suggests_spanning_nodes() -> None:
    with pytest.raises(InferplaneError) as caught:
        plan_fleet(fleet(NODES + "models:\n" + _llama(1)))
    assert "pipeline_parallel_size: 2 (or auto): then TP 2 on each of 2 L40S nodes fits" in (
        caught.value.fix or "")


def test_not_enough_free_nodes_says_how_many_are_needed() -> None:
    with pytest.raises(InferplaneError) as caught:
        plan_fleet(fleet(NODES + "models:\n" + _llama(2, replicas=2)))
    err = caught.value
    assert "placed 1 of 2 replicas" in err.message
    assert "needs 2 nodes with 2 free L40S GPU(s) each" in err.message
    assert "1 node(s) have them" in err.message
    assert err.fix is not None and "add 1 L40S node(s) with 2 GPU(s) each" in err.fix


def test_spanning_replicas_are_never_co_located() -> None:
    two = NODES.replace(
        "    - {name: c, gpu_type: L40S, count: 2, interconnect: pcie}\n", "")
    embed = ("  - {name: embed, source: Qwen--Qwen3-Embedding-0.6B, task: embed, "
             "max_model_len: 2048, gpu_memory_utilization: 0.05}\n")
    with pytest.raises(InferplaneError, match="embed: placed 0 of 1 replicas"):
        plan_fleet(fleet(two + "models:\n" + _llama() + embed))


def test_more_stages_than_layers_is_refused_by_the_planner() -> None:
    profile = load_profile(MODELS / "Qwen--Qwen3-8B")
    tiny = dataclasses.replace(profile, num_layers=2, layer_attention=("full", "full"))
    text = NODES + ("models:\n  - {name: m, source: Qwen--Qwen3-8B, max_model_len: 2048, "
                    "pipeline_parallel_size: 3}\n")
    with pytest.raises(InferplaneError) as caught:
        plan_fleet(fleet(text), profiles={"m": tiny})
    assert "exceeds the model's 2 decoder layers" in caught.value.message


def test_older_vllm_gets_the_ray_commands() -> None:
    text = 'engine: {kind: vllm, version: "0.11.0"}\n' + NODES + "models:\n" + _llama()
    inst = plan_fleet(fleet(text)).instances[0]
    leader, worker = (rank.argv for rank in inst.ranks)
    assert leader[:2] == worker[:2] == ["bash", "-c"]
    assert leader[2].startswith("ray start --head --port=6379 --num-gpus=2 && exec vllm serve")
    assert "--distributed-executor-backend ray" in leader[2]
    assert worker[2] == f"exec ray start --address={LEADER_ADDRESS_TOKEN}:6379 --num-gpus=2 --block"


def test_second_spanning_replica_gets_its_own_coordination_port() -> None:
    four = NODES + "    - {name: d, gpu_type: L40S, count: 2, interconnect: pcie}\n"
    plan = plan_fleet(fleet(four + "models:\n" + _llama(2, replicas=2)))
    ports = [inst.argv[inst.argv.index("--master-port") + 1] for inst in plan.instances]
    assert ports == ["29501", "29502"]
    nodes = [rank.node for inst in plan.instances for rank in inst.ranks]
    assert sorted(nodes) == ["a", "b", "c", "d"]  # every node holds one stage


def test_up_refuses_a_plan_with_replicas_that_span_nodes() -> None:
    plan = plan_fleet(load_fleet(EXAMPLE))
    with pytest.raises(InferplaneError) as caught:
        plan_vllm_instances(plan, node="l40s-server-3")
    err = caught.value
    assert "llama-3.1-70b-instruct spans several nodes" in err.message
    assert err.fix is not None and "inferplane render" in err.fix and "--target k8s" in err.fix


def test_spec_rules_for_spanning_replicas() -> None:
    with pytest.raises(FleetValidationError, match="engine: sim runs every replica"):
        fleet("engine: sim\n" + NODES + "models:\n" + _llama())
    with pytest.raises(FleetValidationError, match="gpus: discover reads the GPUs of one host"):
        fleet("models:\n" + _llama())
    with pytest.raises(FleetValidationError, match=r"spans nodes .* shares no GPU"):
        fleet(NODES + "models:\n" + _llama() + "  - {name: small, source: Qwen--Qwen3-8B, "
              "placement: {colocate_with: [llama]}}\n")
    with pytest.raises(FleetValidationError, match="not an interface name"):
        fleet(NODES.replace("eth1", "'eth 1'", 1) + "models:\n" + _llama())
    with pytest.raises(FleetValidationError, match="pipeline_parallel_size has no effect"):
        fleet('models:\n  - {name: e, endpoints: ["http://10.0.0.1:8000"], '
              "pipeline_parallel_size: 2}\n")
    assert fleet("engine: sim\nmodels:\n" + _llama("auto")).models[0].pipeline_parallel_size \
        == "auto"


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    counts=st.lists(st.sampled_from([1, 2, 4]), min_size=1, max_size=4),
    pp=st.sampled_from(["auto", 2, 3]),
    replicas=st.integers(1, 2),
)
def test_spanning_placement_property(counts: list[int], pp: object, replicas: int) -> None:
    """Whatever the inventory: every replica's stages sit on distinct nodes of one type, each
    with TP GPUs nothing else uses, under budget - or the error names the model."""
    nodes = "".join(
        f"    - {{name: n{i}, gpu_type: L40S, count: {c}, interconnect: pcie}}\n"
        for i, c in enumerate(counts)
    )
    text = ("gpus:\n  nodes:\n" + nodes + "models:\n" + _llama(pp, replicas=replicas)
            + "  - {name: small, source: Qwen--Qwen3-8B, max_model_len: 4096}\n")
    try:
        spec = fleet(text)
    except FleetValidationError as exc:  # too few nodes for an explicit size: line-precise
        assert "models[0].pipeline_parallel_size" in exc.render()
        return
    try:
        plan = plan_fleet(spec, time_limit_s=0.2)
    except InferplaneError as exc:
        assert exc.field is not None and exc.field.startswith(("models.llama", "models.small"))
        return
    for gpu in plan.gpus:
        assert gpu.used_gib <= gpu.budget_gib + 0.01
    for inst in plan.instances_of("llama"):
        groups = [(r.node, tuple(r.gpu_indices)) for r in inst.ranks] or [
            (inst.node, tuple(inst.gpu_indices))]
        assert len({node for node, _ in groups}) == len(groups) == inst.pipeline_parallel_size
        for node, indices in groups:
            assert len(indices) == inst.tensor_parallel_size
            for index in indices:
                gpu = next(g for g in plan.gpus if (g.node, g.index) == (node, index))
                assert gpu.instances == [inst.id] or not inst.ranks
