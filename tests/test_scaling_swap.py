"""Two models that cannot be awake together on one simulated GPU swap on demand through
vLLM sleep mode (real engine processes, the planner's incremental placement)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
from planner_fleets import fleet
from sim_runtime import FAST

from inferplane.runtime import Runtime, RuntimeOptions
from inferplane.scaling.events import read_events

SWAP = """\
engine: sim
gpus:
  nodes:
    - {name: n1, gpu_type: L4, count: 1}
models:
  - name: day
    source: Qwen--Qwen3-8B
    max_model_len: 4096
    max_num_seqs: 4
    replicas: 1
  - name: night
    source: Qwen--Qwen3-8B
    max_model_len: 4096
    max_num_seqs: 4
    replicas: 0
scaling:
  policy: {scale_up_window_s: 0.3, scale_down_window_s: 30, stabilization_s: 0.1}
  models:
    day: {min_replicas: 0, max_replicas: 1, sleep: {level: 1}}
    night: {min_replicas: 0, max_replicas: 1, sleep: {level: 2}}
"""


async def _ask(client: httpx.AsyncClient, url: str, model: str) -> httpx.Response:
    return await client.post(url + "/v1/chat/completions", json={
        "model": model, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}],
    })


async def test_two_models_that_do_not_fit_together_swap_on_demand(tmp_path: Path) -> None:
    rt = Runtime(fleet(SWAP), RuntimeOptions(
        state_dir=tmp_path / "state", gateway_port=0, settings=FAST, grace_period_s=10,
        tenancy=False, control=False, scaling_interval_s=0.05,
    ))
    assert rt.plan is not None and [i.id for i in rt.plan.instances] == ["day-0"]
    assert rt.scaling is not None
    assert rt.scaling.status()["not_awake_together"] == [["day", "night"]]
    await rt.start()
    try:
        assert await rt.wait_settled(30)
        async with httpx.AsyncClient(timeout=60) as client:
            url = rt.gateway_url
            assert (await _ask(client, url, "day")).status_code == 200
            # night does not fit next to day: day (idle) yields by sleeping, night starts
            r = await _ask(client, url, "night")
            assert r.status_code == 200, r.text
            assert rt.asleep_replicas("day") == ["day-0"]
            assert rt.awake_replicas("night") == ["night-0"]
            # and back: night sleeps (level 2), day wakes from host RAM
            assert (await _ask(client, url, "day")).status_code == 200
            assert rt.asleep_replicas("night") == ["night-0"]
            # night wakes at level 2: reallocate, reload the weights, then the KV cache
            assert (await _ask(client, url, "night")).status_code == 200
            # both at once: each is answered, one after the other
            a, b = await asyncio.gather(_ask(client, url, "day"), _ask(client, url, "night"))
            assert a.status_code == b.status_code == 200
        kinds = [(e["model"], e["kind"]) for e in read_events(rt.state_dir.path)
                 if e["kind"] != "warning"]  # host RAM for level-1 sleepers, host-dependent
        assert kinds[:4] == [("day", "sleep"), ("night", "scale_up"), ("night", "sleep"),
                             ("day", "wake")], kinds
        assert any("yields" in e["reason"] for e in read_events(rt.state_dir.path))
        metrics = rt.gateway.metrics.render().decode()
        assert 'inferplane_model_cold_starts_total{kind="wake",model="day"}' in metrics
        assert 'inferplane_model_cold_starts_total{kind="start",model="night"} 1.0' in metrics
        assert len(rt.plan.instances) == 2  # both placed; one awake at a time
    finally:
        await rt.drain_and_stop()


FROM_ZERO = SWAP.replace("    replicas: 1\n", "").replace("    replicas: 0\n", "")


async def test_scale_from_zero_models_larger_than_the_inventory_plan_and_start(
    tmp_path: Path,
) -> None:
    """`min_replicas: 0` without `replicas`: both start at 0 (was: "placed 0 of 1"), the
    plan names the swap set, and each is started by its first request."""
    spec = fleet(FROM_ZERO)
    assert [m.replicas for m in spec.models] == [0, 0]
    from inferplane.planner import plan_fleet

    plan = plan_fleet(spec)
    assert plan.instances == []
    swaps = [w for w in plan.warnings if w.startswith("swap:")]
    assert len(swaps) == 1 and "day and night" in swaps[0]
    assert not any(w.startswith("nothing to place") for w in plan.warnings)
    rt = Runtime(spec, RuntimeOptions(
        state_dir=tmp_path / "state", gateway_port=0, settings=FAST, grace_period_s=10,
        tenancy=False, control=False, scaling_interval_s=0.05,
    ))
    await rt.start()
    try:
        async with httpx.AsyncClient(timeout=60) as client:
            assert (await _ask(client, rt.gateway_url, "night")).status_code == 200
            assert rt.awake_replicas("night") == ["night-0"]
            assert (await _ask(client, rt.gateway_url, "day")).status_code == 200
            assert rt.awake_replicas("day") == ["day-0"]
    finally:
        await rt.drain_and_stop()


def test_level_1_sleepers_that_overflow_host_ram_are_warned_about(tmp_path: Path) -> None:
    rt = Runtime(fleet(SWAP), RuntimeOptions(state_dir=tmp_path / "state", tenancy=False,
                                             control=False))
    assert rt.scaling is not None
    assert rt.scaling.check_host_ram(total_bytes=2**40) is None  # 1 TiB: fine
    why = rt.scaling.check_host_ram(total_bytes=8 * 2**30)
    assert why is not None and "day asleep at max_replicas need" in why
    assert "night" not in why  # level 2 keeps nothing in host RAM
