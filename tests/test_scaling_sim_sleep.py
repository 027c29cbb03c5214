"""The simulator's vLLM sleep mode: levels, tags, reload_weights, and what each costs."""

from __future__ import annotations

import httpx
import pytest
from planner_fleets import fleet

from inferplane.runtime.instances import Instance
from inferplane.scaling.swap import sleep_supported, with_sleep_mode
from inferplane.sim.app import EngineApp
from inferplane.sim.build import build_parts
from inferplane.sim.config import SimEngineConfig
from inferplane.sim.engine import SimEngine
from inferplane.sim.sleep import DISK_BYTES_S, HOST_LINK_BYTES_S, SleepState, cold_start_s
from inferplane.spec import FleetSpec


def test_level_1_costs_a_host_copy_each_way_level_2_a_disk_reload() -> None:
    w = 16e9  # an 8B model in bf16
    one = SleepState(w)
    assert one.sleep(1) == pytest.approx(w / HOST_LINK_BYTES_S)
    assert one.wake([]) == pytest.approx(0.05 + w / HOST_LINK_BYTES_S)
    assert not one.sleeping and one.weights_valid
    two = SleepState(w)
    assert two.sleep(2) < 0.1
    assert two.wake(["weights"]) < 0.1 and two.sleeping  # the KV pool still asleep
    assert not two.weights_valid
    assert two.reload_weights() == pytest.approx(w / DISK_BYTES_S)
    assert two.wake(["kv_cache"]) < 0.1 and not two.sleeping and two.level == 0
    # both are far below a cold start
    assert w / HOST_LINK_BYTES_S < w / DISK_BYTES_S < cold_start_s(w) / 3


def test_bad_level_and_tags_are_refused() -> None:
    with pytest.raises(ValueError, match="1 or 2"):
        SleepState(1e9).sleep(3)
    s = SleepState(1e9)
    s.sleep(2)
    with pytest.raises(ValueError, match="unknown wake_up tags"):
        s.wake(["nope"])
    with pytest.raises(ValueError, match="wake_up\\?tags=weights first"):
        s.reload_weights()


async def test_http_sleep_level_2_needs_reload_weights_before_answering() -> None:
    engine = SimEngine(build_parts(SimEngineConfig(model="m")))
    engine.start()
    app = EngineApp(engine).app
    body = {"model": "m", "prompt": "hi", "max_tokens": 2}
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://sim") as c:
            assert (await c.post("/v1/completions", json=body)).status_code == 200
            assert (await c.post("/sleep?level=2")).status_code == 200
            assert (await c.get("/is_sleeping")).json() == {"is_sleeping": True}
            assert (await c.post("/v1/completions", json=body)).status_code == 400
            assert (await c.post("/wake_up")).status_code == 200
            r = await c.post("/v1/completions", json=body)
            assert r.status_code == 500 and "reload_weights" in r.text
            assert (await c.post("/collective_rpc",
                                 json={"method": "reload_weights"})).status_code == 200
            assert (await c.post("/v1/completions", json=body)).status_code == 200
            assert (await c.post("/sleep?level=7")).status_code == 400
            assert (await c.post("/sleep?level=1")).status_code == 200
            assert (await c.post("/wake_up?tags=kv_cache")).status_code == 200
            assert (await c.get("/is_sleeping")).json() == {"is_sleeping": True}
            assert (await c.post("/wake_up?tags=weights")).status_code == 200
            assert (await c.post("/v1/completions", json=body)).status_code == 200
    finally:
        await engine.stop()


def _vllm_fleet(version: str) -> FleetSpec:
    return fleet(f"""\
engine: {{kind: vllm, version: "{version}"}}
gpus:
  nodes:
    - {{name: box, gpu_type: L40S, count: 1}}
models:
  - name: chat
    source: Qwen--Qwen3-8B
    max_model_len: 4096
scaling:
  models:
    chat: {{min_replicas: 0, max_replicas: 1, sleep: {{level: 2}}}}
""")


def test_sleep_mode_flags_and_the_stop_start_fallback_of_old_engines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inst = Instance(name="chat-0", model="chat", served_name="chat", replica=0, port=1,
                    engine="vllm", argv=("vllm", "serve", "m"))
    new = _vllm_fleet("0.31.0")
    assert sleep_supported(new)
    woken = with_sleep_mode(new, inst)
    assert woken.argv[-1] == "--enable-sleep-mode" and woken.env["VLLM_SERVER_DEV_MODE"] == "1"
    old = _vllm_fleet("0.7.3")
    with caplog.at_level("WARNING", logger="inferplane.scaling"):
        assert not sleep_supported(old)
    assert "no sleep mode" in caplog.text and "stops and starts" in caplog.text
    assert with_sleep_mode(old, inst) is inst
