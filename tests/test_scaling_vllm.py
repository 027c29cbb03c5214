"""The autoscaler on an `engine: vllm` fleet: the fake vLLM binary and FakeNvml stand in
for vLLM and the driver; real processes on 127.0.0.1. A new replica is placed by the
planner's incremental placement on the free card, pinned and preflighted like any start;
scale-down puts it to sleep through vLLM's dev-mode endpoints."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx

from inferplane.gpus.fake_nvml import FakeDevice, FakeNvml
from inferplane.planner import plan_fleet
from inferplane.runtime import Runtime, RuntimeOptions, SupervisorSettings
from inferplane.runtime.instances import free_port
from inferplane.scaling.events import read_events
from inferplane.spec import load_fleet

MODELS = Path(__file__).resolve().parent / "data" / "models"
FAST = SupervisorSettings(
    probe_interval_s=0.2, probe_timeout_s=1.0, failure_threshold=3, startup_deadline_s=60,
    backoff_initial_s=0.2, backoff_max_s=1.0, stop_timeout_s=5,
)
FLEET = f"""\
engine: {{kind: vllm}}
gpus:
  nodes:
    - {{name: box, gpu_type: L40S, count: 2}}
models:
  - name: chat
    source: {MODELS / "Qwen--Qwen3-8B"}
    max_model_len: 4096
    max_num_seqs: 2
    placement: {{exclusive: true}}
scaling:
  policy: {{target_waiting_requests: 1, scale_up_window_s: 0.3, scale_down_window_s: 1.0,
           stabilization_s: 0.3}}
  models:
    chat: {{min_replicas: 1, max_replicas: 2, sleep: {{level: 1}}}}
"""
UUIDS = ["GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-0000-0000-0000-000000000001"]
FAKE_VLLM = f"{sys.executable} -m inferplane.sim.fake_vllm --load-time-s 0.5"


async def test_vllm_fleet_scales_up_on_the_free_card_and_sleeps_on_the_way_down(
    tmp_path: Path,
) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    fleet = load_fleet(path)
    plan = plan_fleet(fleet, time_limit_s=0, fleet_file=str(path))
    [first] = plan.instances
    port = free_port()
    argv = list(first.argv)
    argv[argv.index("--port") + 1] = str(port)
    plan = plan.model_copy(update={"instances": [first.model_copy(update={
        "port": port, "argv": argv, "gpu_uuids": [UUIDS[i] for i in first.gpu_indices]})]})
    rt = Runtime(fleet, RuntimeOptions(
        state_dir=tmp_path / "state", gateway_port=0, settings=FAST, grace_period_s=10,
        plan=plan, nvml=FakeNvml([FakeDevice("NVIDIA L40S", uuid=u) for u in UUIDS]),
        vllm_binary=FAKE_VLLM, tenancy=False, control=False, scaling_interval_s=0.05,
    ))
    assert "--enable-sleep-mode" in rt.instances[0].argv
    assert rt.instances[0].env["VLLM_SERVER_DEV_MODE"] == "1"
    await rt.start()
    try:
        assert await rt.wait_settled(60)
        stop = asyncio.Event()
        statuses: list[int] = []

        async def user(client: httpx.AsyncClient) -> None:
            while not stop.is_set():
                r = await client.post(rt.gateway_url + "/v1/chat/completions", json={
                    "model": "chat", "max_tokens": 300, "ignore_eos": True,
                    "messages": [{"role": "user", "content": "hello"}]})
                statuses.append(r.status_code)

        async with httpx.AsyncClient(timeout=60) as client:
            users = [asyncio.create_task(user(client)) for _ in range(6)]
            try:
                await asyncio.wait_for(_until(lambda: len(rt.backends["chat"]) == 2), 30)
                new = rt.backends["chat"][1]
                await asyncio.wait_for(_until(lambda: new.ready and new.outstanding > 0), 30)
            finally:
                stop.set()
                await asyncio.gather(*users)
            await asyncio.wait_for(_until(lambda: rt.asleep_replicas("chat") != []), 30)
        assert set(statuses) == {200}
        assert rt.plan is not None and len(rt.plan.instances) == 2
        second = next(i for i in rt.plan.instances if i.id != first.id)
        assert second.gpu_indices != first.gpu_indices  # the free card, nothing moved
        assert rt.plan.instance(first.id).gpu_indices == first.gpu_indices
        [asleep] = rt.asleep_replicas("chat")
        log = (tmp_path / "state" / "logs" / f"{asleep}.log").read_text()
        assert "--enable-sleep-mode" in log
        kinds = [e["kind"] for e in read_events(rt.state_dir.path) if e["kind"] != "warning"]
        assert kinds[:2] == ["scale_up", "sleep"], kinds
    finally:
        await rt.drain_and_stop()


async def _until(predicate: object) -> None:
    while not predicate():  # type: ignore[operator]
        await asyncio.sleep(0.02)
