"""A model with a `lora:` block is planned with vLLM's LoRA flags and the variable that lets
the gateway load adapters at run time (GPU and CPU engines)."""

from __future__ import annotations

from pathlib import Path

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
