"""`up` runs what `plan` decided, also on the simulator: a simulated fleet with an inventory
is planned like a real one, each engine gets the plan's memory and limits, and the
gateway's per-replica concurrency cap is the plan's max_num_seqs."""

from __future__ import annotations

from pathlib import Path

import pytest
from planner_fleets import ROOT, fleet

from inferplane.gateway.fleet import UNPLANNED_CONCURRENCY_PER_REPLICA, gateway_config_from_fleet
from inferplane.gpus.spec import GIB
from inferplane.planner import plan_fleet
from inferplane.runtime.instances import plan_sim_instances, plan_simulated
from inferplane.runtime.runner import Runtime, RuntimeOptions
from inferplane.sim.build import build_parts
from inferplane.sim.config import SimEngineConfig
from inferplane.spec import load_fleet

DEMO = ROOT / "examples" / "demo.yaml"


def _flag(argv: tuple[str, ...], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_simulated_engines_get_the_plans_numbers() -> None:
    spec = load_fleet(DEMO)
    plan = plan_simulated(spec, None, str(DEMO))
    assert plan is not None
    instances = plan_sim_instances(spec, plan=plan, port_picker=iter(range(20000, 20100)).__next__)
    assert [i.name for i in instances] == [p.id for p in plan.instances]
    for inst, planned in zip(instances, plan.instances, strict=True):
        argv = inst.argv
        assert _flag(argv, "--gpu") == planned.gpu_type
        assert _flag(argv, "--tensor-parallel-size") == str(planned.tensor_parallel_size)
        assert _flag(argv, "--gpu-memory-utilization") == str(planned.gpu_memory_utilization)
        assert _flag(argv, "--max-num-seqs") == str(planned.max_num_seqs)
        assert _flag(argv, "--max-model-len") == str(planned.max_model_len)
        kv = _flag(argv, "--kv-cache-memory-bytes")
        assert kv == (str(planned.kv_cache_memory_bytes)
                      if planned.kv_cache_memory_bytes is not None else None)
        assert inst.start_after == tuple(planned.start_after)  # co-located: ordered starts


def test_the_simulated_engine_holds_exactly_the_planned_kv_pool() -> None:
    plan = plan_fleet(load_fleet(DEMO))
    planned = next(i for i in plan.instances if i.kv_cache_memory_bytes)
    model = load_fleet(DEMO).model(planned.model)
    assert model is not None and model.source is not None
    parts = build_parts(SimEngineConfig(
        model=planned.served_model_name, model_dir=Path(model.source), gpu=planned.gpu_type,
        tensor_parallel_size=planned.tensor_parallel_size,
        max_model_len=planned.max_model_len, max_num_seqs=planned.max_num_seqs,
        gpu_memory_utilization=planned.gpu_memory_utilization,
        kv_cache_memory_bytes=planned.kv_cache_memory_bytes,
    ))
    assert planned.kv_cache_memory_bytes is not None
    assert abs(parts.memory.kv_cache_gib * GIB - planned.kv_cache_memory_bytes) < GIB / 100
    assert parts.memory.kv_cache_tokens == pytest.approx(planned.memory.kv_cache_tokens,
                                                         rel=0.02)


def test_the_gateway_caps_each_replica_at_the_planned_max_num_seqs() -> None:
    spec = fleet("""
gpus:
  nodes: [{name: n1, gpu_type: H100, count: 1}]
models:
  - {name: qwen3-8b, source: Qwen--Qwen3-8B, max_model_len: 8192}
""")
    plan = plan_fleet(spec)
    planned = plan.instances[0].max_num_seqs
    assert planned != UNPLANNED_CONCURRENCY_PER_REPLICA  # vLLM's default on H100 is larger
    route = gateway_config_from_fleet(spec, plan).models[0]
    assert route.max_concurrency_per_replica == planned
    unplanned = gateway_config_from_fleet(spec).models[0]
    assert unplanned.max_concurrency_per_replica == UNPLANNED_CONCURRENCY_PER_REPLICA


def test_up_on_a_simulated_fleet_runs_its_plan(tmp_path: Path) -> None:
    runtime = Runtime(load_fleet(DEMO), RuntimeOptions(state_dir=tmp_path, tenancy=False,
                                                      control=False, fleet_path=str(DEMO)))
    assert runtime.plan is not None
    assert [i.name for i in runtime.instances] == [p.id for p in runtime.plan.instances]
    caps = {r.name: r.max_concurrency_per_replica for r in runtime.gateway.config.models}
    for planned in runtime.plan.instances:
        assert caps[planned.model] >= planned.max_num_seqs
