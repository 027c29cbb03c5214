"""Issue 27's done-when on the simulator: a fleet with two adapters on one base plans,
starts (`up`'s Runtime, simulated engine processes), lists both adapters with their
parent, answers a chat to each adapter's name with that name, refuses an unknown adapter
with 404, counts usage per adapter, and `status` shows which replica holds which."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
from model_factory import write_safetensors
from sim_runtime import FAST
from typer.testing import CliRunner

from inferplane.cli.main import _register_commands, app
from inferplane.cli.status import add_live_figures
from inferplane.planner import plan_fleet
from inferplane.runtime import Runtime, RuntimeOptions
from inferplane.spec import load_fleet

_register_commands()
BASE = Path(__file__).parent / "data" / "models" / "Qwen--Qwen3-8B"


def peft_adapter(path: Path, rank: int = 8) -> Path:
    """A PEFT LoRA directory for Qwen3-8B's q_proj and v_proj (zeroed weights)."""
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": 16, "bias": "none",
        "target_modules": ["q_proj", "v_proj"], "base_model_name_or_path": "Qwen/Qwen3-8B",
    }))
    tensors: dict[str, tuple[str, list[int]]] = {}
    for layer in range(36):
        prefix = f"base_model.model.model.layers.{layer}.self_attn"
        for module, out in (("q_proj", 4096), ("v_proj", 1024)):
            tensors[f"{prefix}.{module}.lora_A.weight"] = ("BF16", [rank, 4096])
            tensors[f"{prefix}.{module}.lora_B.weight"] = ("BF16", [out, rank])
    write_safetensors(path / "adapter_model.safetensors", tensors)
    return path


def lora_fleet(tmp_path: Path) -> Path:
    sql = peft_adapter(tmp_path / "adapters" / "sql")
    support = peft_adapter(tmp_path / "adapters" / "support")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(f"""\
engine: sim
gpus:
  nodes:
    - {{name: node, gpu_type: L40S, count: 2}}
models:
  - name: qwen3-8b
    source: {BASE}
    replicas: 2
    max_model_len: 4096
    max_num_seqs: 16
    gpu_memory_utilization: 0.9
    lora:
      max_loras: 2
      max_lora_rank: 16
      adapters:
        - {{name: sql, source: {sql}, aliases: [sql-assistant]}}
        - {{name: support, source: {support}}}
""")
    return fleet


def test_plan_starts_engines_with_the_lora_flags(tmp_path: Path) -> None:
    fleet_file = lora_fleet(tmp_path)
    plan = plan_fleet(load_fleet(fleet_file))
    plain = tmp_path / "plain.yaml"  # the same fleet without LoRA
    plain.write_text(fleet_file.read_text().split("    lora:")[0])
    without = plan_fleet(load_fleet(plain))
    assert len(plan.instances) == 2
    for inst, base in zip(plan.instances, without.instances, strict=True):
        lora = inst.memory.lora_gib
        # at one utilization the KV cache gives up the computed reservation (and the LoRA
        # kernels' small shrink buffer in the profile run)
        assert lora > 0
        assert abs(base.memory.kv_cache_gib - inst.memory.kv_cache_gib - lora) < 0.01
    for inst in plan.instances:
        argv = list(inst.argv)
        assert "--enable-lora" in argv
        assert argv[argv.index("--max-loras") + 1] == "2"
        assert any(item.startswith("sql=") for item in argv)


async def test_two_adapters_on_one_base_served_and_billed_each(tmp_path: Path) -> None:
    state = tmp_path / "state"
    rt = Runtime(load_fleet(lora_fleet(tmp_path)), RuntimeOptions(
        state_dir=state, gateway_port=0, settings=FAST, grace_period_s=10, control=False))
    # the gateway's periodic /v1/models read runs once at start (no replica ready yet) and
    # not again in this test: the holdings below are read when the fleet settles
    rt.gateway.adapters.interval_s = 3600.0
    await rt.start()
    try:
        assert await rt.wait_settled(60)
        url = rt.gateway_url
        async with httpx.AsyncClient(timeout=20) as client:
            cards = (await client.get(url + "/v1/models")).json()["data"]
            parents = {c["id"]: c.get("parent") for c in cards}
            assert parents["sql"] == parents["support"] == "qwen3-8b"
            assert parents["sql-assistant"] == "qwen3-8b" and parents["qwen3-8b"] is None
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
            for name, answered in (("sql", "sql"), ("support", "support"),
                                   ("sql-assistant", "sql"), ("sql", "sql")):
                reply = await client.post(url + "/v1/chat/completions",
                                          json={**body, "model": name})
                assert reply.status_code == 200, reply.text
                assert reply.json()["model"] == answered
            unknown = await client.post(url + "/v1/chat/completions",
                                        json={**body, "model": "billing"})
            assert unknown.status_code == 404
            assert unknown.json()["error"]["code"] == "model_not_found"
        # every replica loaded the declared adapters at start (--lora-modules), and the
        # status `up` prints once settled already shows them (no periodic read awaited)
        status = json.loads((state / "state.json").read_text())  # what `up -d` prints
        held = {r["name"]: r.get("adapters") for r in status["instances"]}
        assert held == {"qwen3-8b-0": ["sql", "support"], "qwen3-8b-1": ["sql", "support"]}
        data = rt.status()
        for inst in data["instances"]:
            inst["adapters"] = []  # as a state file written before the engines answered
        # `inferplane status` reads them from the engines' /v1/models now
        await asyncio.to_thread(add_live_figures, data, True)
        assert {i["name"]: i["adapters"] for i in data["instances"]} == held
    finally:
        await rt.drain_and_stop()
    result = await asyncio.to_thread(  # `inferplane usage` runs its own event loop
        CliRunner().invoke, app,
        ["usage", "--by", "model", "--json", "--db", f"sqlite:///{state / 'inferplane.db'}"])
    assert result.exit_code == 0, result.output
    rows = {row["model"]: row for row in json.loads(result.output)["rows"]}
    assert rows["sql"]["requests"] == 3 and rows["support"]["requests"] == 1
    assert rows["sql"]["completion_tokens"] == 9 and rows["support"]["completion_tokens"] == 3
    assert "qwen3-8b" not in rows
