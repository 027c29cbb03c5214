"""Placement hints (node, colocate_with) and `gpus: discover` with NVML-discovered GPUs."""

from __future__ import annotations

import pytest
from planner_fleets import fleet

from inferplane.errors import InferplaneError
from inferplane.gpus.discovery import discover_gpus
from inferplane.gpus.fake_nvml import FakeDevice, FakeNvml
from inferplane.planner import plan_fleet

UUIDS = [f"GPU-{n:08x}-0000-0000-0000-000000000000" for n in range(4)]


def test_discovered_gpus_give_indices_and_uuids() -> None:
    gpus = discover_gpus(FakeNvml([FakeDevice("NVIDIA H100 80GB HBM3", uuid=u) for u in UUIDS]))
    spec = fleet("""
models:
  - {name: qwen3-32b, source: Qwen--Qwen3-32B, max_model_len: 8192, max_num_seqs: 64}
""")
    with pytest.raises(InferplaneError, match="no GPUs were found"):
        plan_fleet(spec)
    plan = plan_fleet(spec, discovered=gpus)
    inst = plan.instances[0]
    assert inst.node == "local" and inst.gpu_uuids == [UUIDS[i] for i in inst.gpu_indices]
    assert inst.env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, inst.gpu_indices))
    assert plan.gpus[0].uuid == UUIDS[0]


def test_node_hint_and_colocation_with_too_few_partners() -> None:
    text = """
gpus:
  nodes:
    - {name: a, gpu_type: L40S, count: 2, interconnect: pcie}
    - {name: b, gpu_type: L40S, count: 2, interconnect: pcie}
models:
  - {name: embed, source: Qwen--Qwen3-Embedding-0.6B, task: embed, max_model_len: 4096,
     replicas: REPLICAS, placement: {node: b}}
  - {name: qwen3-8b, source: Qwen--Qwen3-8B, max_model_len: 8192, max_num_seqs: 8,
     replicas: 2, placement: {colocate_with: [embed]}}
"""
    plan = plan_fleet(fleet(text.replace("REPLICAS", "2")))
    for inst in plan.instances:
        assert inst.node == "b"  # the embeddings are pinned to b; the 8Bs follow them
        assert inst.shares_gpu_with and inst.kv_cache_memory_bytes
    # One embedding for two 8Bs (audit miss): one 8B shares the embedding's card, the
    # other runs where it fits - never two 8B replicas on one card, never a refusal.
    plan = plan_fleet(fleet(text.replace("REPLICAS", "1")))
    embed = plan.instances_of("embed")[0]
    eights = plan.instances_of("qwen3-8b")
    assert [i.shares_gpu_with for i in eights].count([embed.id]) == 1
    assert len({(i.node, tuple(i.gpu_indices)) for i in eights}) == 2
    assert any("qwen3-8b" in w and "embed has 1 replica" in w for w in plan.warnings)
