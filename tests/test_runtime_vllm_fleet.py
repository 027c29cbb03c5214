"""`inferplane up` on `engine: vllm` fleets: plan -> pinned processes, start order, checks.

Without a GPU: the fake `vllm` binary (the simulator behind vLLM's command line) and a
FakeNvml stand in for vLLM and the driver; real processes, real ports on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from inferplane.errors import InferplaneError
from inferplane.gpus.fake_nvml import FakeDevice, FakeNvml, FakeProcess
from inferplane.gpus.spec import GIB
from inferplane.planner import plan_fleet
from inferplane.planner.plan import Plan
from inferplane.runtime import Runtime, RuntimeOptions, SupervisorSettings
from inferplane.runtime.instances import free_port
from inferplane.runtime.process import RotatingLog, spawn
from inferplane.runtime.supervisor import Supervised
from inferplane.runtime.vllm_fleet import (
    GpuPinning,
    check_plan_matches,
    local_node,
    plan_vllm_instances,
    preflight_host,
    startup_deadline_s,
    vllm_command,
)
from inferplane.sim.fake_vllm import parse_serve_args, visible_devices_error
from inferplane.spec import load_fleet

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "tests" / "data" / "models"
FAST = SupervisorSettings(
    probe_interval_s=0.2, probe_timeout_s=1.0, failure_threshold=3, startup_deadline_s=60,
    backoff_initial_s=0.2, backoff_max_s=1.0, stop_timeout_s=5,
)
# Two GPUs: chat + embed co-located on one, solo alone on the other.
FLEET = f"""\
engine:
  kind: vllm
gpus:
  nodes:
    - name: box
      gpu_type: L40S
      count: 2
models:
  - name: chat
    source: {MODELS / "Qwen--Qwen3-8B"}
    max_model_len: 4096
    max_num_seqs: 4
  - name: embed
    source: {MODELS / "Qwen--Qwen3-Embedding-0.6B"}
    task: embed
    max_model_len: 2048
    max_num_seqs: 8
    placement:
      colocate_with: [chat]
  - name: solo
    source: {MODELS / "Qwen--Qwen3-8B"}
    max_model_len: 4096
    placement:
      exclusive: true
"""
UUIDS = ["GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-0000-0000-0000-000000000001"]
FAKE_VLLM = f"{sys.executable} -m inferplane.sim.fake_vllm --load-time-s 1"


def _fleet_file(tmp_path: Path, text: str = FLEET) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return path


def _with_port(argv: list[str], port: int) -> list[str]:
    out = list(argv)
    out[out.index("--port") + 1] = str(port)
    return out


def _plan(fleet_path: Path, *, uuids: bool = True) -> Plan:
    """The planner's plan, on free ports here, with GPU UUIDs as discovery records them."""
    plan = plan_fleet(load_fleet(fleet_path), time_limit_s=0, fleet_file=str(fleet_path))
    instances = []
    for inst in plan.instances:
        port = free_port()
        update: dict[str, object] = {"port": port, "argv": _with_port(inst.argv, port)}
        if uuids:
            update["gpu_uuids"] = [UUIDS[i] for i in inst.gpu_indices]
        instances.append(inst.model_copy(update=update))
    return plan.model_copy(update={"instances": instances})


def _nvml(*, swapped: bool = False, held_gib: float = 0.0) -> FakeNvml:
    """Two L40S. `swapped`: the UUIDs enumerate in the other order than at planning time
    (P20); `held_gib`: a foreign process (pid 4242) holds that much of the second card."""
    uuids = list(reversed(UUIDS)) if swapped else UUIDS
    devices = [FakeDevice("NVIDIA L40S", uuid=u) for u in uuids]
    if held_gib:
        held = int(held_gib * GIB)
        devices[1].used_bytes = held
        devices[1].processes = [FakeProcess(4242, held, "python3")]
    return FakeNvml(devices)


# ---- unit: deadline, binary, plan checks, node choice --------------------------------------


def test_startup_deadline_grows_with_weights_and_slow_disks() -> None:
    assert startup_deadline_s(0) == 180.0  # the floor
    assert startup_deadline_s(2 * GIB) == 180.0  # small models: still the floor
    moe = 35 * 10**9  # ~35 GB of weights (P24: "35B MoE needs ~600 s")
    expected = 120.0 + 1.5 * moe / (100 * 2**20)
    assert startup_deadline_s(moe) == pytest.approx(expected)
    assert 600 < startup_deadline_s(moe) < 650
    assert startup_deadline_s(moe, 2000) == 180.0  # local NVMe: the floor again
    assert startup_deadline_s(moe, 50) > startup_deadline_s(moe, 100)
    with pytest.raises(InferplaneError, match="disk-bandwidth"):
        startup_deadline_s(moe, 0)


def test_vllm_command_and_plan_argv_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INFERPLANE_VLLM_BINARY", raising=False)
    assert vllm_command(None) == ["vllm"]
    monkeypatch.setenv("INFERPLANE_VLLM_BINARY", "/opt/py -m fake")
    assert vllm_command(None) == ["/opt/py", "-m", "fake"]
    assert vllm_command("/usr/bin/vllm") == ["/usr/bin/vllm"]
    plan = _plan(_fleet_file(tmp_path), uuids=False)
    instances = {i.name: i for i in plan_vllm_instances(plan, node="box", vllm_binary="/x/v")}
    chat, embed, solo = instances["chat-0"], instances["embed-0"], instances["solo-0"]
    assert chat.argv[:2] == ("/x/v", "serve") and chat.argv[-2:] == ("--host", "127.0.0.1")
    assert chat.argv[2:-2] == tuple(plan.instance("chat-0").argv[2:])
    assert embed.start_after == ("chat-0",) and chat.start_after == () == solo.start_after
    assert embed.gpu_indices == chat.gpu_indices != solo.gpu_indices
    assert embed.env["CUDA_VISIBLE_DEVICES"] == str(embed.gpu_indices[0])
    assert embed.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert chat.startup_deadline_s == startup_deadline_s(plan.instance("chat-0").weights_bytes)


def test_a_plan_for_another_fleet_is_refused(tmp_path: Path) -> None:
    plan = _plan(_fleet_file(tmp_path))
    check_plan_matches(plan, load_fleet(tmp_path / "fleet.yaml"))
    more = load_fleet(_fleet_file(tmp_path, FLEET.replace(
        "    max_num_seqs: 4\n  - name: embed",
        "    max_num_seqs: 4\n    replicas: 2\n  - name: embed")))
    with pytest.raises(InferplaneError, match=r"'chat' has 2 replica.* but 1 in the plan"):
        check_plan_matches(plan, more)
    renamed = load_fleet(_fleet_file(tmp_path, FLEET.replace("name: solo", "name: single")))
    with pytest.raises(InferplaneError, match="places 'solo', which the fleet does not have"):
        check_plan_matches(plan, renamed)


def test_the_cli_refuses_a_mismatched_plan(tmp_path: Path) -> None:
    plan = _plan(_fleet_file(tmp_path))
    (tmp_path / "plan.json").write_text(plan.model_dump_json())
    _fleet_file(tmp_path, FLEET.replace("name: solo", "name: single"))
    cli = subprocess.run(
        [sys.executable, "-m", "inferplane", "up", str(tmp_path / "fleet.yaml"),
         "--plan", str(tmp_path / "plan.json"), "--state-dir", str(tmp_path / "s")],
        capture_output=True, text=True, timeout=60,
    )
    assert cli.returncode == 2, cli.stdout + cli.stderr
    assert "does not match the fleet" in cli.stderr


def test_the_node_must_be_named_when_the_fleet_spans_several(tmp_path: Path) -> None:
    two = FLEET.replace("      count: 2\n", "      count: 1\n    - name: box2\n"
                        "      gpu_type: L40S\n      count: 1\n")
    fleet = load_fleet(_fleet_file(tmp_path, two))
    plan = plan_fleet(fleet, time_limit_s=0)
    with pytest.raises(InferplaneError, match=r"spans nodes box, box2.*--node"):
        local_node(fleet, plan, None)
    with pytest.raises(InferplaneError, match="no such node"):
        local_node(fleet, plan, "elsewhere")
    assert local_node(fleet, plan, "box2") == "box2"
    here = plan_vllm_instances(plan, node="box2")
    assert here and {i.name for i in here} == {
        i.id for i in plan.instances if i.node == "box2"
    }
    single = load_fleet(_fleet_file(tmp_path))
    assert local_node(single, plan_fleet(single, time_limit_s=0), None) == "box"


# ---- unit: GPU pinning and free-memory checks (FakeNvml) -----------------------------------


def test_uuids_are_resolved_to_todays_indices(tmp_path: Path) -> None:
    plan = _plan(_fleet_file(tmp_path))
    chat = next(i for i in plan_vllm_instances(plan, node="box") if i.name == "chat-0")
    planned = chat.gpu_indices[0]
    pinned = GpuPinning(_nvml(swapped=True))(chat)  # the card now enumerates elsewhere
    assert pinned.gpu_indices == (1 - planned,)
    assert pinned.env["CUDA_VISIBLE_DEVICES"] == str(1 - planned)
    assert pinned.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_an_occupied_card_is_refused_naming_the_process(tmp_path: Path) -> None:
    plan = _plan(_fleet_file(tmp_path), uuids=False)
    instances = plan_vllm_instances(plan, node="box")
    on_second = next(i for i in instances if i.gpu_indices == (1,))
    # Each instance alone would fit next to 4 GiB, but not everything planned on card 1.
    share = sum(i.gpu_memory_utilization for i in instances if i.gpu_indices == (1,))
    held = 44.0 * (1 - share) + 1.0
    with pytest.raises(InferplaneError, match=r"GPU 1 .*held by .*4242"):
        preflight_host(instances, _nvml(held_gib=held))
    with pytest.raises(InferplaneError, match=r"GPU 1 .*4242.*P22"):
        GpuPinning(_nvml(held_gib=40))(on_second)
    preflight_host(instances, _nvml())  # nothing held: fine


async def test_inherited_cuda_visible_devices_is_overridden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7,6,5")  # the host's (P21)
    plan = _plan(_fleet_file(tmp_path))
    solo = next(i for i in plan_vllm_instances(plan, node="box") if i.name == "solo-0")
    pinned = GpuPinning(_nvml())(solo)
    log = RotatingLog(tmp_path / "env.log")
    proc = await spawn(
        [sys.executable, "-c", "import os; print('seen', os.environ['CUDA_VISIBLE_DEVICES'], "
         "os.environ['CUDA_DEVICE_ORDER'])"], pinned.env, log,
    )
    assert await proc.wait() == 0
    log.close()
    assert f"seen {solo.gpu_indices[0]} PCI_BUS_ID" in (tmp_path / "env.log").read_text()


def test_fake_vllm_reads_serve_flags_and_checks_visible_devices() -> None:
    config, ignored = parse_serve_args([
        "serve", str(MODELS / "Qwen--Qwen3-8B"), "--served-model-name", "chat", "--port",
        "8123", "--max-model-len", "4096", "--tensor-parallel-size", "2",
        "--gpu-memory-utilization", "0.5", "--kv-cache-memory-bytes", "123", "--runner",
        "pooling", "--no-enable-prefix-caching",
    ])
    assert (config.model, config.port, config.max_model_len) == ("chat", 8123, 4096)
    assert config.tensor_parallel_size == 2 and config.gpu_memory_utilization == 0.5
    assert config.model_dir == MODELS / "Qwen--Qwen3-8B" and not config.enable_prefix_caching
    assert config.host == "127.0.0.1"
    # --kv-cache-memory-bytes sizes the simulated pool as vLLM's (the contract's 64M engines)
    assert ignored == [] and config.kv_cache_memory_bytes == 123 and config.runner == "pooling"
    assert "exposes 1 GPU" in (visible_devices_error(2, "0") or "")
    assert visible_devices_error(2, "0,1") is None and visible_devices_error(1, None) is None


# ---- integration: real processes with the fake vllm binary --------------------------------


async def _until(predicate: object, timeout_s: float = 60) -> None:
    async def poll() -> None:
        while not predicate():  # type: ignore[operator]
            await asyncio.sleep(0.05)

    await asyncio.wait_for(poll(), timeout_s)


async def test_up_starts_colocated_instances_in_order_and_serves(tmp_path: Path) -> None:
    fleet_path = _fleet_file(tmp_path)
    plan = _plan(fleet_path)
    rt = Runtime(load_fleet(fleet_path), RuntimeOptions(
        state_dir=tmp_path / "state", gateway_port=0, settings=FAST, grace_period_s=10,
        plan=plan, nvml=_nvml(swapped=True), vllm_binary=FAKE_VLLM,
    ))
    events: list[tuple[str, str, int | None]] = []
    notify = rt.supervisor._on_change

    def record(rec: Supervised) -> None:
        events.append((rec.instance.name, rec.state, rec.pid))
        if notify is not None:
            notify(rec)

    rt.supervisor._on_change = record
    await rt.start()
    pids: list[int] = []
    try:
        assert await rt.wait_settled(120), [r.last_error for r in rt.supervisor.records.values()]
        pids = [r.pid for r in rt.supervisor.records.values() if r.pid is not None]
        assert len(pids) == 3

        def first(name: str, ready: bool) -> int:
            return next(n for n, (inst, state, pid) in enumerate(events) if inst == name
                        and (state == "ready" if ready else pid is not None))

        # The co-located embed starts only once chat is ready; solo (own GPU) did not wait.
        assert first("embed-0", ready=False) > first("chat-0", ready=True)
        assert first("solo-0", ready=False) < first("chat-0", ready=True)
        # UUIDs resolved to today's indices (the fake NVML enumerates them swapped, P20).
        log = (tmp_path / "state" / "logs" / "embed-0.log").read_text()
        today = 1 - plan.instance("embed-0").gpu_indices[0]
        assert f"CUDA_VISIBLE_DEVICES={today} CUDA_DEVICE_ORDER=PCI_BUS_ID" in log
        status = json.loads((tmp_path / "state" / "state.json").read_text())
        assert status["node"] == "box"
        assert {i["name"]: i["gpus"] for i in status["instances"]}["embed-0"] == [today]
        assert (tmp_path / "state" / "plan.json").is_file()
        async with httpx.AsyncClient(timeout=30) as client:
            resp = await client.post(rt.gateway_url + "/v1/chat/completions", json={
                "model": "chat", "max_tokens": 4,
                "messages": [{"role": "user", "content": "hello"}],
            })
            assert resp.status_code == 200, resp.text
            assert resp.json()["choices"][0]["message"]["content"]
    finally:
        await rt.drain_and_stop()
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                   for p in pids)


async def test_a_refused_start_is_reported_and_nothing_starts(tmp_path: Path) -> None:
    fleet_path = _fleet_file(tmp_path)
    rt = Runtime(load_fleet(fleet_path), RuntimeOptions(
        state_dir=tmp_path / "state", gateway_port=0, settings=FAST,
        plan=_plan(fleet_path), nvml=_nvml(held_gib=40), vllm_binary=FAKE_VLLM,
    ))
    with pytest.raises(InferplaneError, match="4242"):
        await rt.start()
    assert all(r.pid is None for r in rt.supervisor.records.values())
    assert not (tmp_path / "state" / "up.pid").exists()


UP_SCRIPT = """\
import asyncio, sys
from pathlib import Path
from inferplane.gpus.fake_nvml import FakeDevice, FakeNvml
from inferplane.runtime import control
from inferplane.runtime.runner import RuntimeOptions
from inferplane.runtime.supervisor import SupervisorSettings
from inferplane.runtime.vllm_fleet import load_plan
from inferplane.spec import load_fleet

here = Path(sys.argv[1])
nvml = FakeNvml([FakeDevice("NVIDIA L40S", uuid=u) for u in {uuids!r}])
options = RuntimeOptions(
    state_dir=here / "state", gateway_port=0, grace_period_s=30,
    settings=SupervisorSettings(probe_interval_s=0.2, probe_timeout_s=1.0,
                                backoff_initial_s=0.2, stop_timeout_s=5),
    plan=load_plan(here / "plan.json"), nvml=nvml, vllm_binary={binary!r},
    fleet_path=str(here / "fleet.yaml"),
)
sys.exit(asyncio.run(control.run_foreground(load_fleet(here / "fleet.yaml"), options)))
"""


async def test_sigterm_stops_a_vllm_fleet_with_no_orphans(tmp_path: Path) -> None:
    fleet_path = _fleet_file(tmp_path)
    (tmp_path / "plan.json").write_text(_plan(fleet_path).model_dump_json())
    script = tmp_path / "up.py"
    script.write_text(UP_SCRIPT.format(uuids=UUIDS, binary=FAKE_VLLM))
    state = tmp_path / "state" / "state.json"
    up = subprocess.Popen([sys.executable, str(script), str(tmp_path)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        await _until(lambda: state.exists()
                     and json.loads(state.read_text())["phase"] == "running", 120)
        status = json.loads(state.read_text())
        assert {i["state"] for i in status["instances"]} == {"ready"}
        engines = [psutil.Process(i["pid"]) for i in status["instances"]]
        children = [c for e in engines for c in e.children(recursive=True)]
        async with httpx.AsyncClient(timeout=30) as client:
            resp = await client.post(status["gateway"]["url"] + "/v1/completions", json={
                "model": "solo", "prompt": "hi", "max_tokens": 3})
            assert resp.status_code == 200, resp.text
        up.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(up.wait, 60) == 0
        leftovers = [p for p in engines + children
                     if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not leftovers
        assert not (tmp_path / "state" / "up.pid").exists()
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


# ---- the real thing ------------------------------------------------------------------------

REAL_FLEET = """\
engine: vllm
gpus: discover
models:
  - name: real
    source: {source}
    max_model_len: 2048
    max_num_seqs: 4
    gpu_memory_utilization: 0.3
"""


@pytest.mark.gpu
async def test_up_runs_real_vllm_on_a_real_gpu(tmp_path: Path) -> None:
    """Needs `vllm` on PATH, an NVIDIA GPU and a local model directory in
    INFERPLANE_TEST_VLLM_MODEL (e.g. a downloaded Qwen3-0.6B)."""
    source = os.environ.get("INFERPLANE_TEST_VLLM_MODEL")
    if shutil.which("vllm") is None or not source:
        pytest.skip("needs the vllm binary and INFERPLANE_TEST_VLLM_MODEL")
    fleet_path = _fleet_file(tmp_path, REAL_FLEET.format(source=source))
    plan = plan_fleet(load_fleet(fleet_path), time_limit_s=0)
    port = free_port()
    plan = plan.model_copy(update={"instances": [
        plan.instances[0].model_copy(
            update={"port": port, "argv": _with_port(plan.instances[0].argv, port)})
    ]})
    rt = Runtime(load_fleet(fleet_path), RuntimeOptions(
        state_dir=tmp_path / "state", gateway_port=0, plan=plan, grace_period_s=30,
        settings=SupervisorSettings(probe_interval_s=1.0, stop_timeout_s=30),
    ))
    await rt.start()
    try:
        assert await rt.wait_settled(900), (tmp_path / "state" / "logs" / "real-0.log").read_text()
        async with httpx.AsyncClient(timeout=120) as client:
            resp = await client.post(rt.gateway_url + "/v1/completions", json={
                "model": "real", "prompt": "The capital of France is", "max_tokens": 5})
            assert resp.status_code == 200, resp.text
        log = (tmp_path / "state" / "logs" / "real-0.log").read_text()
        assert "--- starting: vllm serve" in log and "--host 127.0.0.1" in log
    finally:
        await rt.drain_and_stop()
