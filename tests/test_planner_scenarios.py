"""The seed scenarios planned end to end: S0 (co-location on L40S), S4 (peak coexistence),
TP sizing by KV demand, placement rules, explanations, determinism and the JSON schema."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest
from planner_fleets import ROOT, fleet

from inferplane.errors import InferplaneError
from inferplane.gpus.spec import GIB
from inferplane.planner import Plan, plan_fleet
from inferplane.spec import load_fleet, parse_fleet

S0 = ROOT / "examples" / "s0-l40s-colocated.yaml"
S4 = ROOT / "examples" / "s4-deepseek-qwen-mix.yaml"


@pytest.fixture(scope="module")
def s0() -> Plan:
    return plan_fleet(load_fleet(S0), fleet_file=str(S0))


@pytest.fixture(scope="module")
def s4() -> Plan:
    return plan_fleet(load_fleet(S4), fleet_file=str(S4))


def test_s0_every_l40s_holds_one_llm_and_one_embedding_within_the_card_budget(s0: Plan) -> None:
    assert s0.totals.gpus_used == 3
    for gpu in s0.gpus:
        here = [s0.instance(i) for i in gpu.instances]
        assert sorted(i.model == "qwen3-embedding-0.6b" for i in here) == [False, True]
        fractions = sum(i.gpu_memory_utilization for i in here)
        contexts = sum(i.memory.cuda_context_gib for i in here) / gpu.memory_gib
        assert fractions + contexts <= 0.95 + 1e-9  # P01
        assert gpu.used_gib <= gpu.budget_gib + 0.01
        llm = next(i for i in here if i.model != "qwen3-embedding-0.6b")
        embed = next(i for i in here if i.model == "qwen3-embedding-0.6b")
        assert 0.70 <= llm.gpu_memory_utilization <= 0.90
        assert embed.gpu_memory_utilization < 0.2
        # Co-located: explicit KV pools, and the small one starts after the big one.
        assert llm.kv_cache_memory_bytes and embed.kv_cache_memory_bytes
        assert embed.start_after == [llm.id] and llm.start_after == []
        assert "--kv-cache-memory-bytes" in embed.argv
        assert embed.env["CUDA_VISIBLE_DEVICES"] == str(gpu.index)


def test_s0_has_no_oom_per_the_estimator(s0: Plan) -> None:
    # No instance is short of one max_model_len request (the estimator's P02 error).
    assert not [w for w in s0.warnings if "P02" in w]
    for inst in s0.instances:
        assert inst.memory.max_concurrency >= 1
        assert inst.memory.kv_cache_gib * GIB >= (inst.kv_cache_memory_bytes or 0) - GIB / 100


def test_s0_keeps_the_users_capture_sizes_as_one_json_argument(s0: Plan) -> None:
    argv = s0.instances_of("qwen3-30b-a3b")[0].argv
    config = json.loads(argv[argv.index("--compilation-config") + 1])
    assert config == {"cudagraph_capture_sizes": [1, 2, 4, 8]}


def test_s4_needs_eleven_gpus_at_peak_and_says_where_each_goes(s4: Plan) -> None:
    assert s4.totals.gpus_needed_at_peak == 11 == s4.totals.gpus_used
    r1 = s4.instances_of("deepseek-r1")[0]
    assert (r1.node, r1.gpu_indices, r1.tensor_parallel_size) == ("h200-node-1", list(range(8)), 8)
    q32 = s4.instances_of("qwen3-32b")[0]
    assert q32.node == "h100-node-1" and q32.gpu_indices in ([0, 1], [2, 3], [4, 5], [6, 7])
    q8 = s4.instances_of("qwen3-8b")[0]
    assert q8.node == "h100-node-1" and q8.tensor_parallel_size == 1
    # exclusive: nothing else on R1's GPUs
    for gpu in s4.gpus:
        if gpu.node == "h200-node-1":
            assert gpu.instances == [r1.id]
    assert "NCCL_P2P_DISABLE" not in r1.env  # NVLink
    assert r1.argv[r1.argv.index("--gpu-memory-utilization") + 1] == "0.85"


def test_s4_on_one_server_explains_what_is_missing() -> None:
    # Only two H100s next to the H200 server: R1 and the 32B fit, the 8B does not.
    text = S4.read_text().replace(
        "gpu_type: H100-SXM-80GB\n      count: 8", "gpu_type: H100-SXM-80GB\n      count: 2"
    )
    assert "count: 2" in text
    spec = parse_fleet(text, filename=str(S4))
    with pytest.raises(InferplaneError) as caught:
        plan_fleet(spec)
    message = caught.value.render()
    assert "qwen3-8b" in message and "P08" in message and "add 1 H100-SXM-80GB" in message


def _llama70(seqs: int) -> Plan:
    return plan_fleet(fleet(f"""
gpus:
  nodes: [{{name: n1, gpu_type: A100-40GB, count: 8, interconnect: nvlink}}]
models:
  - name: llama-70b
    source: meta-llama--Llama-3.1-70B-Instruct
    max_model_len: 8192
    max_num_seqs: {seqs}
"""))


def test_70b_on_40gb_cards_picks_tp_by_the_kv_requirement() -> None:
    small = _llama70(1).instances[0]
    big = _llama70(16).instances[0]
    assert small.tensor_parallel_size == 4  # P16: the smallest TP that holds the demand
    assert big.tensor_parallel_size == 8
    assert big.memory.max_concurrency >= 16
    assert big.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"


def test_tp_group_never_spans_nodes() -> None:
    spec = fleet("""
gpus:
  nodes:
    - {name: a, gpu_type: A100-40GB, count: 4}
    - {name: b, gpu_type: A100-40GB, count: 4}
models:
  - {name: llama-70b, source: meta-llama--Llama-3.1-70B-Instruct, max_model_len: 8192,
     tensor_parallel_size: 8}
""")
    with pytest.raises(InferplaneError, match="llama-70b"):
        plan_fleet(spec)


def test_tp_group_never_mixes_gpu_types_and_pcie_groups_get_nccl_settings() -> None:
    spec = fleet("""
gpus:
  nodes:
    - {name: mixed-a, gpu_type: L40S, count: 2, interconnect: pcie}
    - {name: mixed-b, gpu_type: A100-80GB, count: 1}
models:
  - {name: qwen3-32b, source: Qwen--Qwen3-32B, max_model_len: 8192, max_num_seqs: 4,
     tensor_parallel_size: 2}
""")
    plan = plan_fleet(spec)
    inst = plan.instances[0]
    assert inst.node == "mixed-a" and inst.gpu_type == "L40S" and inst.gpu_indices == [0, 1]
    assert inst.env["NCCL_P2P_DISABLE"] == "1"  # P34: no NVLink
    assert inst.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_a_model_too_big_for_the_inventory_gets_fixes_with_numbers() -> None:
    spec = fleet("""
gpus:
  nodes: [{name: n1, gpu_type: L40S, count: 1}]
models:
  - {name: qwen3-32b, source: Qwen--Qwen3-32B, max_model_len: 32768}
""")
    with pytest.raises(InferplaneError) as caught:
        plan_fleet(spec)
    err = caught.value
    assert err.field == "models.qwen3-32b"
    assert "qwen3-32b does not fit" in err.message and "L40S" in err.message
    assert err.fix is not None
    assert "quantization: fp8 and kv_cache_dtype: fp8: then TP 1 on L40S fits" in err.fix
    assert "a larger GPU" in err.fix and "2 L40S GPUs on one node (TP 2; node n1" in err.fix


def test_a_too_long_context_suggests_the_longest_that_fits() -> None:
    spec = fleet("""
gpus:
  nodes: [{name: n1, gpu_type: L4, count: 1}]
models:
  - {name: llama-8b, source: meta-llama--Llama-3.1-8B, max_model_len: 131072}
""")
    with pytest.raises(InferplaneError) as caught:
        plan_fleet(spec)
    fix = caught.value.fix or ""
    assert "max_model_len: " in fix and "kv_cache_dtype: fp8" in fix
    length = int(fix.split("max_model_len: ")[1].split()[0])
    assert 1000 < length < 131072


def test_too_many_replicas_names_how_many_fit() -> None:
    spec = fleet("""
gpus:
  nodes: [{name: n1, gpu_type: H100, count: 2}]
models:
  - {name: qwen3-8b, source: Qwen--Qwen3-8B, max_model_len: 8192, replicas: 3,
     gpu_memory_utilization: 0.9}
""")
    with pytest.raises(InferplaneError) as caught:
        plan_fleet(spec)
    assert caught.value.fix is not None and "replicas: 2 for qwen3-8b" in caught.value.fix


def test_spread_uses_separate_cards_and_binpack_shares_them() -> None:
    text = """
gpus:
  nodes: [{name: n1, gpu_type: H100, count: 4}]
models:
  - {name: embed, source: Qwen--Qwen3-Embedding-0.6B, task: embed, max_model_len: 2048,
     max_num_seqs: 4, replicas: 1}
  - {name: llama-8b, source: meta-llama--Llama-3.1-8B, max_model_len: 4096, max_num_seqs: 4}
"""
    packed = plan_fleet(fleet(text))
    spread = plan_fleet(fleet(text), policy="spread")
    assert packed.totals.gpus_used == 1 and spread.totals.gpus_used == 2
    assert packed.gpus[0].used_gib <= packed.gpus[0].budget_gib


def test_plans_are_deterministic_and_validate_against_the_schema(s4: Plan) -> None:
    again = plan_fleet(load_fleet(S4), fleet_file=str(S4))
    assert again.model_dump_json() == s4.model_dump_json()
    jsonschema.validate(s4.model_dump(mode="json"), Plan.model_json_schema())
    ports = [i.port for i in s4.instances]
    assert ports == [8100, 8101, 8102]


def test_cli_json_and_exit_code() -> None:
    cmd = [sys.executable, "-m", "inferplane", "plan"]
    ok = subprocess.run([*cmd, str(S4), "--json"], capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    data = json.loads(ok.stdout)
    jsonschema.validate(data, Plan.model_json_schema())
    assert data["totals"]["gpus_used"] == 11
    table = subprocess.run([*cmd, str(S0)], capture_output=True, text=True, check=False)
    assert table.returncode == 0 and "weights" in table.stdout and "qwen3-32b-fp8-0" in table.stdout
    bad = subprocess.run([*cmd, str(S4), "--card-budget", "1.5"], capture_output=True,
                         text=True, check=False)
    assert bad.returncode == 2 and "card_budget_fraction" in bad.stderr
