"""SLA mode: replicas from latency targets through the performance model."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import httpx
import pytest
from sim_runtime import CHAT_FLEET, start_runtime

from inferplane.gateway.metrics import GatewayMetrics
from inferplane.scaling.controller import gateway_totals
from inferplane.scaling.events import read_events
from inferplane.scaling.policy import ModelAutoscaler, Observation
from inferplane.scaling.sla import (
    ReplicaModel,
    SlaTracker,
    estimate,
    histogram,
    quantile,
    replica_model_for,
)
from inferplane.sim.config import FaultConfig
from inferplane.spec import ModelScaling, ScalingPolicy

SLA_FLEET = CHAT_FLEET + """\
scaling:
  policy: {target_waiting_requests: 100, scale_up_window_s: 0.3, scale_down_window_s: 60,
           stabilization_s: 0.1, target_ttft_p95_s: 1.0, target_itl_p95_s: 0.5}
  models:
    chat: {min_replicas: 1, max_replicas: 3}
"""

# a toy replica: decode step 10 ms + 1 ms per sequence, prefill 0.1 ms per prompt token
TOY = ReplicaModel(step_s=lambda b, ctx: 0.010 + 0.001 * b, prefill_s=lambda n: 1e-4 * n,
                   max_num_seqs=64)


def test_replicas_grow_with_the_rate_and_meet_both_targets() -> None:
    counts = [estimate(TOY, rate=r, prompt_tokens=500, output_tokens=100, ttft_target_s=0.5,
                       itl_target_s=0.05).replicas for r in (0.5, 5, 20, 80)]
    assert counts == sorted(counts) and counts[0] == 1 and counts[-1] > counts[1]
    e = estimate(TOY, rate=20, prompt_tokens=500, output_tokens=100, ttft_target_s=0.5,
                 itl_target_s=0.05)
    assert e.itl_s <= 0.05 and e.ttft_s <= 0.5
    assert 20 / (e.replicas * e.throughput_per_replica) <= 0.8 + 1e-9
    assert estimate(TOY, rate=0, prompt_tokens=1, output_tokens=1, ttft_target_s=None,
                    itl_target_s=None).replicas == 0


def test_the_per_request_overhead_adds_to_ttft_and_can_make_a_target_unreachable() -> None:
    from dataclasses import replace
    slow_api = replace(TOY, request_overhead_s=0.2)
    for rate in (0.5, 5, 20):
        plain = estimate(TOY, rate=rate, prompt_tokens=500, output_tokens=100,
                         ttft_target_s=None, itl_target_s=0.05)
        paid = estimate(slow_api, rate=rate, prompt_tokens=500, output_tokens=100,
                        ttft_target_s=None, itl_target_s=0.05)
        # outside the GPU: the same replicas and throughput, TTFT exactly 0.2 s later
        assert paid.replicas == plain.replicas
        assert paid.throughput_per_replica == plain.throughput_per_replica
        assert paid.ttft_s == pytest.approx(plain.ttft_s + 0.2)
    # a target the overhead alone nearly fills needs more replicas (less queueing left)
    roomy = estimate(TOY, rate=20, prompt_tokens=500, output_tokens=100, ttft_target_s=0.3,
                     itl_target_s=0.05)
    tight = estimate(slow_api, rate=20, prompt_tokens=500, output_tokens=100,
                     ttft_target_s=0.3, itl_target_s=0.05)
    assert tight.replicas > roomy.replicas and tight.ttft_s <= 0.3
    # below the overhead no replica count helps: the estimate runs to max_replicas
    never = estimate(slow_api, rate=1, prompt_tokens=500, output_tokens=100,
                     ttft_target_s=0.15, itl_target_s=None, max_replicas=7)
    assert never.replicas == 7 and never.ttft_s > 0.15


def test_the_simulators_replica_model_carries_its_request_overhead(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from inferplane.sim import timing
    # The shipped Hopper cost is 0 on direct vllm serve runs; give it one to see it arrive.
    slow = replace(timing.GENERATION_CALIBRATION["hopper"], request_overhead_s=0.05)
    monkeypatch.setitem(timing.GENERATION_CALIBRATION, "hopper", slow)
    model = replica_model_for(None, "demo", gpu="H100-SXM-80GB", tp=1, max_num_seqs=64,
                              max_model_len=4096)
    assert model.request_overhead_s == 0.05
    e = estimate(model, rate=0, prompt_tokens=100, output_tokens=10, ttft_target_s=None,
                 itl_target_s=None)
    # ... and before the engine, the chat template the API server renders for it
    assert model.frontend_s == slow.chat_template_s > 0
    assert e.ttft_s == pytest.approx(model.prefill_s(100) + 0.05 + model.frontend_s)


def test_a_tighter_itl_target_shrinks_the_batch_and_needs_more_replicas() -> None:
    loose = estimate(TOY, rate=20, prompt_tokens=500, output_tokens=100, ttft_target_s=None,
                     itl_target_s=0.08)
    tight = estimate(TOY, rate=20, prompt_tokens=500, output_tokens=100, ttft_target_s=None,
                     itl_target_s=0.02)
    assert tight.batch < loose.batch and tight.replicas > loose.replicas
    # a slower engine than modelled (correction 2x) needs more
    slow = estimate(TOY, rate=20, prompt_tokens=500, output_tokens=100, ttft_target_s=None,
                    itl_target_s=0.08, correction=2.0)
    assert slow.replicas > loose.replicas


def test_the_tracker_learns_rate_mix_and_correction_online() -> None:
    t = SlaTracker(TOY, ttft_target_s=0.5, itl_target_s=0.05, halflife_s=1.0)
    finished = prompt = completion = itl_sum = itl_count = 0.0
    for tick in range(60):  # 10 requests/s, 200 + 50 tokens, ITL twice the model's
        finished += 1
        prompt += 200
        completion += 50
        itl_count += 50
        itl_sum += 50 * 2 * (0.010 + 0.001 * 4)
        t.update(tick * 0.1, finished=finished, prompt_tokens=prompt,
                 completion_tokens=completion, backlog=0, itl=(itl_sum, itl_count),
                 ttft_buckets={0.1: finished, math.inf: finished}, running=4)
    assert t.rate == pytest.approx(10, rel=0.05)
    assert t.prompt_tokens == pytest.approx(200, rel=0.1)
    assert t.output_tokens == pytest.approx(50, rel=0.1)
    assert t.correction == pytest.approx(2.0, rel=0.1)
    e, note = t.estimate(10)
    assert "predicted TTFT" in note and "observed TTFT p95 0.1 s" in note and e.replicas >= 1


def test_histogram_parsing_and_quantile() -> None:
    text = "\n".join([
        'vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 90',
        'vllm:time_to_first_token_seconds_bucket{le="0.5",model_name="m"} 99',
        'vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 100',
        'vllm:time_to_first_token_seconds_sum{model_name="m"} 12.5',
        'vllm:time_to_first_token_seconds_count{model_name="m"} 100',
    ])
    buckets, total, count = histogram(text, "vllm:time_to_first_token_seconds")
    assert buckets == {0.1: 90, 0.5: 99, math.inf: 100} and (total, count) == (12.5, 100)
    assert quantile(buckets, 0.95) == 0.5 and quantile({}, 0.95) is None


def test_the_simulators_model_is_the_performance_model() -> None:
    m = replica_model_for(None, "m", gpu="H100-SXM-80GB", tp=1, max_num_seqs=32,
                          max_model_len=4096)
    assert m.max_num_seqs == 32
    assert 0 < m.step_s(1, 1000) < m.step_s(32, 32000)
    assert m.prefill_s(100) < m.prefill_s(4000)


def test_sla_mode_scales_on_the_model_before_any_queue() -> None:
    policy = ScalingPolicy(target_waiting_requests=5, scale_up_window_s=1,
                           scale_down_window_s=5, stabilization_s=1, target_ttft_p95_s=0.5)
    s = ModelAutoscaler("m", ModelScaling(min_replicas=1, max_replicas=8), policy)
    rising = Observation(replicas=1, waiting=0, in_flight=2, capacity_per_replica=64,
                         needed=3, sla="rate 20/s")
    assert s.observe(0, rising) is None
    d = s.observe(1, rising)
    assert d is not None and d.desired == 3 and "SLA: 3 needed (rate 20/s)" in d.reason
    falling = Observation(replicas=3, waiting=0, in_flight=30, capacity_per_replica=64,
                          needed=2)
    assert s.observe(2, falling) is None
    d = s.observe(7, falling)
    assert d is not None and d.action == "scale_down" and d.desired == 2


def test_the_autoscaler_reads_the_gateways_counts_before_any_scrape() -> None:
    """The gateway keeps per-request counts pending until a collection folds them; the
    SLA rate and mix must see every finished request even when nothing scrapes."""
    metrics = GatewayMetrics(lambda: iter(()))
    series = metrics.series("chat", "chat-0")
    for status in (200, 200, 429):
        series.count(status)
    metrics.add_tokens("chat", 60, 200)
    metrics.add_tokens("other", 7, 7)
    assert gateway_totals(metrics, "chat") == (3, 60, 200)
    series.count(200)
    metrics.add_tokens("chat", 60, 200)
    assert gateway_totals(metrics, "chat") == (4, 120, 400)  # nothing counted twice
    assert gateway_totals(metrics, "absent") == (0, 0, 0)


async def test_a_rising_rate_adds_replicas_before_ttft_p95_crosses_its_target(
    tmp_path: Path,
) -> None:
    """Real simulated engines: the rate steps up; the performance model asks for a second
    replica while the observed TTFT p95 is still within its target."""
    rt = await start_runtime(tmp_path, SLA_FLEET, faults={"chat": FaultConfig(slowdown=3)})
    ttfts: list[tuple[float, float]] = []  # (sent at, ttft)
    try:
        loop = asyncio.get_running_loop()
        t0 = loop.time()

        async def one(client: httpx.AsyncClient) -> None:
            sent = loop.time()
            body = {"model": "chat", "max_tokens": 200, "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True},
                    "messages": [{"role": "user", "content": "hello " * 50}]}
            async with client.stream("POST", rt.gateway_url + "/v1/chat/completions",
                                     json=body) as resp:
                assert resp.status_code == 200
                first: float | None = None
                async for line in resp.aiter_lines():
                    if first is None and '"content":"' in line and '"content":""' not in line:
                        first = loop.time() - sent
            assert first is not None
            ttfts.append((sent - t0, first))

        async with httpx.AsyncClient(timeout=60) as client:
            tasks = []
            for rate in (0.5, 1, 1.5, 2, 3, 4):  # requests per second, 1.5 s each
                end = loop.time() + 1.5
                while loop.time() < end:
                    tasks.append(asyncio.create_task(one(client)))
                    await asyncio.sleep(1 / rate)
                if len(rt.awake_replicas("chat")) > 1:
                    break
            await asyncio.gather(*tasks)
        ups = [e for e in read_events(rt.state_dir.path) if e["kind"] == "scale_up"]
        assert ups, "no scale-up"
        assert "SLA:" in ups[0]["reason"] and "predicted TTFT" in ups[0]["reason"]
        up_at = ups[0]["at"] - (time.time() - (loop.time() - t0))  # on the test's clock
        before = sorted(t for sent, t in ttfts if sent < up_at)
        assert before, "scaled before any request finished"
        p95 = before[min(len(before) - 1, int(0.95 * len(before)))]
        assert p95 <= 1.0, (p95, ups[0]["reason"])  # the target: not crossed yet
    finally:
        await rt.drain_and_stop()
