"""`engine: {kind: vllm, device: cpu}`: spec checks, the cores-and-RAM planner, the launch
env, status, render without GPU resources, and `up` on the fake vllm binary."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from model_factory import embed_model_dir, llama_tensors, make_model_dir, tiny_llama_config
from typer.testing import CliRunner

from inferplane.cli.main import _register_commands, app
from inferplane.deploy.options import RenderOptions
from inferplane.deploy.render import render_files
from inferplane.engines.vllm import cpu as vllm_cpu
from inferplane.errors import InferplaneError
from inferplane.gpus.cpu_host import CpuHost
from inferplane.planner import plan_fleet
from inferplane.planner.cpu import HOST_RAM_BUDGET, plan_cpu_fleet
from inferplane.planner.incremental import add_replicas, remove_replicas
from inferplane.planner.plan import Plan
from inferplane.runtime import Runtime, RuntimeOptions
from inferplane.runtime.instances import free_port
from inferplane.runtime.supervisor import SupervisorSettings
from inferplane.runtime.vllm_fleet import (
    check_plan_matches,
    plan_vllm_instances,
    preflight_cpu_host,
)
from inferplane.spec import FleetValidationError, load_fleet

GIB = 2**30
TWO_CORES = CpuHost(cores=(0, 1), memory_bytes=16 * GIB, available_bytes=16 * GIB)


def _models(tmp_path: Path) -> tuple[Path, Path]:
    config = tiny_llama_config()
    chat = make_model_dir(tmp_path, config, llama_tensors(config), name="tiny-chat")
    embed = embed_model_dir(tmp_path / "tiny-embed")
    return chat, embed


def _fleet(tmp_path: Path, body: str) -> Path:
    chat, embed = _models(tmp_path)
    path = tmp_path / "fleet.yaml"
    path.write_text(body.format(chat=chat, embed=embed))
    return path


CI_FLEET = """
engine: {{kind: vllm, device: cpu}}
models:
  - name: chat
    source: {chat}
    replicas: 2
    max_model_len: 512
  - name: embed
    source: {embed}
    task: embed
    max_model_len: 512
    placement: {{colocate_with: [chat]}}
"""


def _errors(path: Path) -> str:
    with pytest.raises(FleetValidationError) as info:
        load_fleet(path)
    return str(info.value)


# ---- spec ----------------------------------------------------------------------------------


def test_device_cpu_needs_vllm_and_cpu_nodes(tmp_path: Path) -> None:
    bad = _fleet(tmp_path, "engine: {{kind: sim, device: cpu}}\nmodels:\n"
                           "  - {{name: m, source: {chat}}}\n")
    assert "engine.device" in _errors(bad) and "kind: vllm, device: cpu" in _errors(bad)
    gpu_node = _fleet(tmp_path, "engine: {{kind: vllm, device: cpu}}\ngpus:\n  nodes:\n"
                                "    - {{name: n, gpu_type: L40S, count: 1}}\nmodels:\n"
                                "  - {{name: m, source: {chat}}}\n")
    assert "gpus.nodes[0].gpu_type" in _errors(gpu_node)
    cpu_node = _fleet(tmp_path, "gpus:\n  nodes:\n"
                                "    - {{name: n, cpu_cores: 4, host_memory_gib: 8}}\nmodels:\n"
                                "  - {{name: m, source: {chat}}}\n")
    assert "device: cpu" in _errors(cpu_node)
    no_ram = _fleet(tmp_path, "engine: {{kind: vllm, device: cpu}}\ngpus:\n  nodes:\n"
                              "    - {{name: n, cpu_cores: 4}}\nmodels:\n"
                              "  - {{name: m, source: {chat}}}\n")
    assert "host_memory_gib" in _errors(no_ram)


def test_device_cpu_refuses_sleep_tp_and_gpu_fields(tmp_path: Path) -> None:
    path = _fleet(tmp_path, """
engine: {{kind: vllm, device: cpu}}
models:
  - {{name: m, source: {chat}, tensor_parallel_size: 2, gpu_memory_utilization: 0.5}}
scaling:
  models:
    m: {{min_replicas: 1, max_replicas: 2, sleep: {{level: 1}}}}
""")
    text = _errors(path)
    assert "models[0].tensor_parallel_size" in text
    assert "models[0].gpu_memory_utilization" in text
    assert "scaling.models.m.sleep" in text and "no sleep mode on CPU" in text
    cuda = _fleet(tmp_path, "models:\n  - {{name: m, source: {chat}, cpu_cores: 2}}\n")
    assert "models[0].cpu_cores" in _errors(cuda)


# ---- cores and RAM -------------------------------------------------------------------------


def test_two_cores_two_chat_replicas_and_an_embedder_sharing_a_core(tmp_path: Path) -> None:
    plan = plan_fleet(load_fleet(_fleet(tmp_path, CI_FLEET)), cpu_host=TWO_CORES)
    assert plan.device == "cpu" and plan.gpus == []
    by_id = {i.id: i for i in plan.instances}
    assert [by_id[i].cpu_cores for i in ("chat-0", "chat-1", "embed-0")] == [[0], [1], [0]]
    assert by_id["embed-0"].shares_gpu_with == ["chat-0"]
    for inst in plan.instances:
        assert inst.env[vllm_cpu.THREADS_BIND_ENV] == str(inst.cpu_cores[0])
        assert "CUDA_VISIBLE_DEVICES" not in inst.env
        argv = inst.argv
        assert argv[argv.index("--kv-cache-memory-bytes") + 1] == str(inst.kv_cache_memory_bytes)
        assert "--enforce-eager" in argv  # eager unless the fleet asks otherwise
    assert by_id["embed-0"].argv[-2:] == ["--runner", "pooling"]
    [node] = plan.cpus
    assert node.used_gib <= node.budget_gib
    assert any("shares core(s) 0 with chat-0" in w for w in plan.warnings)


def test_more_replicas_than_cores_is_a_clear_error(tmp_path: Path) -> None:
    fleet = load_fleet(_fleet(tmp_path, CI_FLEET.replace("replicas: 2", "replicas: 3")))
    with pytest.raises(InferplaneError) as info:
        plan_fleet(fleet, cpu_host=TWO_CORES)
    err = info.value
    assert err.field == "models.chat.replicas" and err.value == 3
    assert "3 replicas need their own cores" in err.message and "has 2" in err.message
    assert err.fix is not None and "lower replicas" in err.fix


def test_ram_too_small_names_the_node_and_what_is_needed(tmp_path: Path) -> None:
    path = _fleet(tmp_path, """
engine: {{kind: vllm, device: cpu}}
gpus:
  nodes:
    - {{name: small, cpu_cores: 8, host_memory_gib: 4}}
models:
  - {{name: chat, source: {chat}, replicas: 2, max_model_len: 512}}
""")
    with pytest.raises(InferplaneError) as info:
        plan_fleet(load_fleet(path))
    err = info.value
    assert err.field == "gpus.nodes.0.host_memory_gib" and err.value == 4.0
    assert "node small's RAM" in err.message and "chat-0" in err.message
    assert err.fix is not None and "more RAM" in err.fix


def test_declared_node_and_explicit_cores(tmp_path: Path) -> None:
    path = _fleet(tmp_path, """
engine: {{kind: vllm, device: cpu}}
gpus:
  nodes:
    - {{name: box, cpu_cores: 8, host_memory_gib: 32}}
models:
  - {{name: chat, source: {chat}, replicas: 2, cpu_cores: 3, max_model_len: 512}}
  - {{name: embed, source: {embed}, task: embed, max_model_len: 512}}
""")
    plan = plan_fleet(load_fleet(path))
    cores = {i.id: i.cpu_cores for i in plan.instances}
    assert cores == {"chat-0": [0, 1, 2], "chat-1": [3, 4, 5], "embed-0": [6, 7]}
    assert plan.instance("chat-1").env[vllm_cpu.THREADS_BIND_ENV] == "3-5"


@settings(max_examples=40, deadline=None)
@given(replicas=st.integers(1, 6), cores=st.integers(1, 8), ram_gib=st.integers(1, 40),
       seqs=st.integers(1, 512))
def test_engines_never_oversubscribe_cores_or_ram(
    tmp_path_factory: pytest.TempPathFactory, replicas: int, cores: int, ram_gib: int, seqs: int
) -> None:
    """Oracle: a plan either refuses, or gives disjoint cores and a RAM sum under budget."""
    root = tmp_path_factory.mktemp("cpu")
    path = _fleet(root, "engine: {{kind: vllm, device: cpu}}\nmodels:\n"
                        f"  - {{{{name: chat, source: {{chat}}, replicas: {replicas}, "
                        f"max_num_seqs: {seqs}}}}}\n")
    host = CpuHost(tuple(range(cores)), ram_gib * GIB, ram_gib * GIB)
    try:
        plan = plan_cpu_fleet(load_fleet(path), host=host)
    except InferplaneError as exc:
        assert exc.field in ("models.chat.replicas", "gpus")
        assert replicas > cores or (replicas * (2 * GIB + 64 * 2**20)
                                    > ram_gib * GIB * HOST_RAM_BUDGET)
        return
    taken = [c for i in plan.instances for c in i.cpu_cores]
    assert len(taken) == len(set(taken)) and set(taken) <= set(range(cores))
    assert all(i.cpu_cores for i in plan.instances)
    used = sum(i.host_memory_bytes or 0 for i in plan.instances)
    assert used <= ram_gib * GIB * HOST_RAM_BUDGET
    for inst in plan.instances:
        assert vllm_cpu.parse_threads_bind(inst.env[vllm_cpu.THREADS_BIND_ENV]) == inst.cpu_cores
        assert inst.kv_cache_memory_bytes is not None and inst.kv_cache_memory_bytes >= 64 * 2**20


@given(st.sets(st.integers(0, 300), min_size=1, max_size=40))
def test_threads_bind_round_trips(cores: set[int]) -> None:
    text = vllm_cpu.threads_bind(cores)
    assert vllm_cpu.parse_threads_bind(text) == sorted(cores)
    assert len(text.split(",")) <= len(cores)


def test_autoscaler_replicas_use_reserved_cores_and_stop_at_max(tmp_path: Path) -> None:
    body = CI_FLEET.replace("replicas: 2", "replicas: 1") + (
        "scaling:\n  models:\n    chat: {{min_replicas: 1, max_replicas: 2}}\n")
    fleet = load_fleet(_fleet(tmp_path, body))
    plan = plan_fleet(fleet, cpu_host=TWO_CORES)
    assert [i.id for i in plan.instances] == ["chat-0", "embed-0"]
    assert any("stopping and starting" in w and "no sleep mode" in w for w in plan.warnings)
    assert any("reserved for the autoscaler" in w and "chat-1" in w for w in plan.warnings)
    grown = add_replicas(fleet, plan, "chat", 1)
    new = grown.instance("chat-1")
    assert new.cpu_cores == [1] and new.port not in {i.port for i in plan.instances}
    with pytest.raises(InferplaneError) as info:
        add_replicas(fleet, grown, "chat", 1)
    assert info.value.field == "scaling.models.chat.max_replicas"
    shrunk = remove_replicas(fleet, grown, ["chat-1"])
    assert [i.id for i in shrunk.instances] == ["chat-0", "embed-0"]
    assert shrunk.cpus[0].instances == ["chat-0", "embed-0"]


def test_the_registry_serves_the_cpu_engine() -> None:
    from inferplane.engines import engine_for, engines

    assert ("vllm", "cpu") in engines()
    engine = engine_for("vllm", "cpu")
    assert engine.device == "cpu" and not engine.supports_sleep("0.32.0")
    assert engine.image("0.32.0", fallback="x") == f"{vllm_cpu.CPU_IMAGE_REPOSITORY}:v0.32.0"
    assert engine.batch_defaults(16 * GIB, None, 512, "0.32.0") == (128, 2048)
    assert engine_for("vllm").supports_sleep("0.32.0")  # the GPU engine still sleeps


# ---- launch --------------------------------------------------------------------------------


def test_launch_env_binds_cores_and_sets_no_gpu(tmp_path: Path) -> None:
    fleet = load_fleet(_fleet(tmp_path, CI_FLEET))
    plan = plan_fleet(fleet, cpu_host=TWO_CORES)
    instances = plan_vllm_instances(plan, node="local", vllm_binary="/venv/bin/vllm")
    for inst in instances:
        assert inst.argv[0] == "/venv/bin/vllm" and inst.argv[-2:] == ("--host", "127.0.0.1")
        assert "CUDA_VISIBLE_DEVICES" not in inst.env
        assert inst.env[vllm_cpu.THREADS_BIND_ENV] == ",".join(map(str, inst.cpu_cores))
        assert inst.host_memory_bytes > vllm_cpu.ENGINE_RUNTIME_BYTES
        assert inst.startup_deadline_s == vllm_cpu.STARTUP_FLOOR_S  # CPU-bound imports
        assert "--gpu-memory-utilization" not in inst.argv  # a GPU fraction misleads here
    check_plan_matches(plan, fleet)
    gpu_fleet = load_fleet(_fleet(tmp_path, CI_FLEET.replace(", device: cpu", "")))
    with pytest.raises(InferplaneError, match="device cpu"):
        check_plan_matches(plan, gpu_fleet)


def test_preflight_refuses_missing_cores_and_short_ram(tmp_path: Path) -> None:
    plan = plan_fleet(load_fleet(_fleet(tmp_path, CI_FLEET)), cpu_host=TWO_CORES)
    instances = plan_vllm_instances(plan, node="local")
    preflight_cpu_host(instances, TWO_CORES)
    with pytest.raises(InferplaneError, match=r"core\(s\) 1"):
        preflight_cpu_host(instances, CpuHost((0,), 16 * GIB, 12 * GIB))
    with pytest.raises(InferplaneError, match="GiB is available now") as info:
        preflight_cpu_host(instances, CpuHost((0, 1), 16 * GIB, 1 * GIB))
    assert info.value.fix is not None


# ---- render --------------------------------------------------------------------------------


def _cpu_plan(tmp_path: Path) -> tuple[Path, Plan]:
    path = _fleet(tmp_path, """
engine: {{kind: vllm, device: cpu}}
gpus:
  nodes:
    - {{name: box, cpu_cores: 4, host_memory_gib: 32}}
models:
  - {{name: chat, source: {chat}, replicas: 2, max_model_len: 512}}
  - {{name: embed, source: {embed}, task: embed, max_model_len: 512,
     placement: {{colocate_with: [chat]}}}}
""")
    return path, plan_fleet(load_fleet(path))


def _text(files: dict[str, str]) -> str:
    return "\n".join(files.values())


def test_render_compose_systemd_k8s_without_gpu_resources(tmp_path: Path) -> None:
    path, plan = _cpu_plan(tmp_path)
    fleet = load_fleet(path)
    options = RenderOptions(fleet_text=path.read_text())
    compose = render_files(fleet, plan, "compose", options)
    text = _text(compose)
    assert "nvidia" not in text and "CUDA_VISIBLE_DEVICES" not in text
    services = yaml.safe_load(next(v for k, v in compose.items() if k.endswith("compose.yaml")))
    chat1 = next(s for s in services["services"].values()
                 if s["labels"]["io.inferplane.instance"] == "chat-1")
    assert chat1["cpuset"] == "2-3" and chat1["image"].startswith(vllm_cpu.CPU_IMAGE_REPOSITORY)
    assert "deploy" not in chat1
    units = _text(render_files(fleet, plan, "systemd", options))
    assert "CPUAffinity=2 3" in units and "CUDA_VISIBLE_DEVICES" not in units
    manifests = render_files(fleet, plan, "k8s", options)
    k8s = _text(manifests)
    assert "nvidia.com/gpu" not in k8s and "nvidia-smi" not in k8s
    docs = [d for v in manifests.values() for d in yaml.safe_load_all(v) if d]
    engines = [d for d in docs if d.get("kind") == "Deployment"
               and d["metadata"]["name"] in ("chat", "embed")]
    assert sorted(d["metadata"]["name"] for d in engines) == ["chat", "embed"]
    for deployment in engines:
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        resources = container["resources"]
        assert resources["requests"] == resources["limits"]
        assert resources["requests"]["cpu"] == "2"
        assert vllm_cpu.THREADS_BIND_ENV in container["command"][2]


# ---- CLI and `up` ------------------------------------------------------------------------


def test_plan_cli_prints_cores_and_ram(tmp_path: Path) -> None:
    _register_commands()
    path, _ = _cpu_plan(tmp_path)
    result = CliRunner().invoke(app, ["plan", str(path)], env={"COLUMNS": "140"})
    assert result.exit_code == 0, result.output
    assert "CPU nodes" in result.output and "chat-1" in result.output and "2-3" in result.output
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert "4 CPU cores on 1 node" in result.output and "on CPU" in result.output
    bad = tmp_path / "bad.yaml"
    bad.write_text(path.read_text().replace("replicas: 2", "replicas: 5"))
    result = CliRunner().invoke(app, ["plan", str(bad)])
    assert isinstance(result.exception, InferplaneError)  # `main()` prints it, exit 2
    assert result.exception.field == "models.chat.replicas"


FAKE_VLLM = f"{sys.executable} -m inferplane.sim.fake_vllm --load-time-s 0.5"
FAST = SupervisorSettings(probe_interval_s=0.2, probe_timeout_s=2, backoff_initial_s=0.1,
                          backoff_max_s=0.5, failure_threshold=2)


async def test_up_runs_a_cpu_fleet_with_bound_cores(tmp_path: Path) -> None:
    fleet_path = _fleet(tmp_path, CI_FLEET)
    plan = plan_fleet(load_fleet(fleet_path), cpu_host=TWO_CORES)
    moved = []
    for inst in plan.instances:
        port = free_port()
        argv = list(inst.argv)
        argv[argv.index("--port") + 1] = str(port)
        moved.append(inst.model_copy(update={"port": port, "argv": argv}))
    plan = plan.model_copy(update={"instances": moved})
    rt = Runtime(load_fleet(fleet_path), RuntimeOptions(
        state_dir=tmp_path / "state", gateway_port=0, settings=FAST, grace_period_s=5,
        plan=plan, vllm_binary=FAKE_VLLM, tenancy=False, control=False,
    ))
    await rt.start()
    try:
        assert await rt.wait_settled(60), [r.last_error for r in rt.supervisor.records.values()]
        state = json.loads((tmp_path / "state" / "state.json").read_text())
        assert {i["name"]: i["cpus"] for i in state["instances"]} == {
            "chat-0": [0], "chat-1": [1], "embed-0": [0]}
        log = (tmp_path / "state" / "logs" / "chat-1.log").read_text()
        assert "--kv-cache-memory-bytes" in log
        import httpx

        async with httpx.AsyncClient(base_url=rt.gateway_url, timeout=30) as client:
            reply = await client.post("/v1/chat/completions", json={
                "model": "chat", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4})
            assert reply.status_code == 200, reply.text
            vectors = await client.post("/v1/embeddings", json={"model": "embed",
                                                                "input": ["a"]})
            assert vectors.status_code == 200, vectors.text
    finally:
        await asyncio.wait_for(rt.drain_and_stop(), 60)


def test_cpu_argv_has_no_gpu_memory_utilization_even_when_the_args_carry_one() -> None:
    from inferplane.engines.vllm.argv import VllmArgs, build_vllm_argv

    args = VllmArgs(source="/m", served_model_name="m", port=8000, max_model_len=512,
                    tensor_parallel_size=1, gpu_memory_utilization=0.92,
                    kv_cache_memory_bytes=64 * 2**20)
    argv = vllm_cpu.serve_argv(args, version="0.32.0")
    assert "--gpu-memory-utilization" not in argv
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == str(64 * 2**20)
    # the GPU engine still writes it (the same builder)
    assert "--gpu-memory-utilization" in build_vllm_argv(args, version="0.32.0")
