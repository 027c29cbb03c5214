"""A model with a `lora:` block is planned with vLLM's LoRA flags and the variable that lets
the gateway load adapters at run time (GPU and CPU engines)."""

from __future__ import annotations

from pathlib import Path

import pytest
from lora_adapters import make_adapter
from planner_fleets import fleet

from inferplane.engines.vllm.lora import RUNTIME_LORA_ENV
from inferplane.planner import plan_fleet


def _fleet(adapters: Path, extra: str = "") -> str:
    for name in ("sql", "support"):
        make_adapter(adapters / name, "meta-llama--Llama-3.1-8B-Instruct")
    return f"""
gpus:
  nodes: [{{name: a, gpu_type: H100-SXM-80GB, count: 1}}]
models:
  - name: llama
    source: meta-llama--Llama-3.1-8B-Instruct
    max_model_len: 8192
    lora:
      max_loras: 2
      max_lora_rank: 16
      max_cpu_loras: 4
      adapters:
        - {{name: sql, source: {adapters}/sql}}
        - {{name: support, source: {adapters}/support, aliases: [helpdesk]}}
{extra}"""


def test_the_plan_carries_the_lora_flags_and_env(tmp_path: Path) -> None:
    plan = plan_fleet(fleet(_fleet(tmp_path)))
    inst = plan.instances_of("llama")[0]
    argv = inst.argv
    at = argv.index("--lora-modules")
    assert argv[at + 1:at + 3] == [f"sql={tmp_path}/sql", f"support={tmp_path}/support"]
    for flag, value in (("--max-loras", "2"), ("--max-lora-rank", "16"),
                        ("--max-cpu-loras", "4")):
        assert argv[argv.index(flag) + 1] == value
    assert "--enable-lora" in argv and "helpdesk" not in " ".join(argv)  # aliases: gateway's
    assert inst.env.items() >= RUNTIME_LORA_ENV.items()


def test_the_models_env_may_turn_runtime_loading_off(tmp_path: Path) -> None:
    text = _fleet(tmp_path).replace(
        "    max_model_len: 8192\n",
        "    max_model_len: 8192\n    env: {VLLM_ALLOW_RUNTIME_LORA_UPDATING: 'False'}\n")
    inst = plan_fleet(fleet(text)).instances_of("llama")[0]
    assert inst.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "False"


def _plain(text: str) -> str:
    """The same fleet without the lora: block (it is the model's last key)."""
    return text[:text.index("    lora:")]


def test_the_kv_cache_is_smaller_by_the_reservation(tmp_path: Path) -> None:
    pinned = _fleet(tmp_path).replace("max_model_len: 8192\n",
                                      "max_model_len: 8192\n    gpu_memory_utilization: 0.9\n")
    with_lora = plan_fleet(fleet(pinned)).instances_of("llama")[0]
    without = plan_fleet(fleet(_plain(pinned))).instances_of("llama")[0]
    # 2 slots at rank 16 over Llama-3.1-8B in bf16 (tests/test_estimator_lora.py: 92,356,608
    # bytes per slot at rank 16) and the profile run's fp32 shrink buffer (3 x tokens x 16 x 4)
    reserved = 2 * 92_356_608 / 2**30
    shrink = 3 * with_lora.max_num_batched_tokens * 16 * 4 / 2**30
    assert with_lora.memory.lora_gib == pytest.approx(reserved, abs=1e-4)
    assert without.memory.lora_gib == 0.0
    assert without.memory.kv_cache_gib - with_lora.memory.kv_cache_gib == pytest.approx(
        reserved + shrink, abs=2e-3)
    assert with_lora.memory.kv_cache_tokens < without.memory.kv_cache_tokens


def test_a_cpu_engine_holds_the_slots_in_host_memory(tmp_path: Path) -> None:
    cpu = _fleet(tmp_path).replace(
        "gpus:\n  nodes: [{name: a, gpu_type: H100-SXM-80GB, count: 1}]\n",
        "engine: {kind: vllm, device: cpu}\n"
        "gpus:\n  nodes: [{name: a, cpu_cores: 16, host_memory_gib: 64}]\n")
    with_lora = plan_fleet(fleet(cpu)).instances_of("llama")[0]
    without = plan_fleet(fleet(_plain(cpu))).instances_of("llama")[0]
    assert with_lora.memory.lora_gib == pytest.approx(2 * 92_356_608 / 2**30, abs=1e-4)
    # the node's RAM is shared out the same; the KV pool gives up what the slots take
    assert with_lora.host_memory_bytes == without.host_memory_bytes
    assert with_lora.kv_cache_memory_bytes is not None
    assert without.kv_cache_memory_bytes is not None
    assert without.kv_cache_memory_bytes - with_lora.kv_cache_memory_bytes == pytest.approx(
        2 * 92_356_608, abs=1 << 20)
    assert "--enable-lora" in with_lora.argv
    assert with_lora.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
