"""One model of the API server's cost: the live engine, the offline replay, capacity's
clock and the SLA estimate agree (inferplane/sim/frontend.py)."""

from __future__ import annotations

import asyncio
import random
import statistics
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferplane.bench.simclock import Arrival, simulate
from inferplane.scaling.sla import ReplicaModel, estimate
from inferplane.sim.build import build_parts
from inferplane.sim.config import SimEngineConfig
from inferplane.sim.core import EngineCore, KvCapacity
from inferplane.sim.engine import SimEngine
from inferplane.sim.frontend import ProcessorSharing, api_server_work_s, mean_sojourn_s
from inferplane.sim.offline import WorkItem, run_workload, synthetic_prompt
from inferplane.sim.scheduler import SimRequest
from inferplane.sim.timing import DEFAULT_CALIBRATION

# Roofline timing (the front end is off with fixed step times), a visible per-request cost
CAL = replace(DEFAULT_CALIBRATION, chat_template_s=0.004, tokenize_s=0.001,
              request_overhead_s=0.0005)
CONFIG = SimEngineConfig(model="m", max_model_len=2048, calibration=CAL, tick_s=0.002)
PARTS = build_parts(CONFIG)


def _core() -> EngineCore:
    m = PARTS.memory
    return EngineCore(KvCapacity(m.num_gpu_blocks, m.block_size, m.max_num_seqs,
                                 m.max_num_batched_tokens), PARTS.timing)


def _replay_ttfts(items: list[WorkItem], work_s: float) -> float:
    return run_workload(_core(), items, frontend_s=work_s).mean_ttft_s


async def _live_ttfts(items: list[WorkItem], endpoint: str) -> float:
    """Mean TTFT on the live engine's own (simulated) clock for a burst of `items`, each
    its own API call, all sent at one instant of the event loop."""
    engine = SimEngine(build_parts(CONFIG))
    engine.start()
    loop = asyncio.get_running_loop()
    requests = [SimRequest(request_id=f"r{k}", prompt_token_ids=item.prompt_token_ids,
                           output_tokens=item.output_tokens, finish_reason="length",
                           arrival_s=0.0)
                for k, item in enumerate(items)]
    t0 = loop.time()
    frozen = pytest.MonkeyPatch()
    frozen.setattr(loop, "time", lambda: t0)  # the burst arrives at one instant
    try:
        queues = [engine.submit(r, endpoint=endpoint) for r in requests]
    finally:
        frozen.undo()
    try:
        for request, queue in zip(requests, queues, strict=True):
            while not (await queue.get()).finished:
                pass
            engine.release(request)
    finally:
        await engine.stop()
    overhead = engine.core.timing.request_overhead_s
    return statistics.fmean(r.first_token_s - r.arrival_s + overhead for r in requests
                            if r.first_token_s is not None)


bursts = st.lists(st.tuples(st.integers(8, 300), st.integers(1, 4)), min_size=1, max_size=8)


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bursts, st.sampled_from(["chat", "completions"]))
def test_live_engine_and_replay_agree_on_ttft(burst: list[tuple[int, int]],
                                             endpoint: str) -> None:
    items = [WorkItem(synthetic_prompt(n, k), out) for k, (n, out) in enumerate(burst)]
    work = api_server_work_s(PARTS.timing.calibration, endpoint, coded=False)
    assert work == (0.004 if endpoint == "chat" else 0.001)
    live = asyncio.run(_live_ttfts(items, endpoint))
    replay = _replay_ttfts(items, work)
    assert live == pytest.approx(replay, abs=1e-6)
    # The oracle: the burst reaches the engine together, len(burst) x the work after it
    # was sent, so TTFT grows by exactly that over an engine without a front end.
    assert replay == pytest.approx(_replay_ttfts(items, 0.0) + len(items) * work, abs=1e-6)


async def test_a_call_with_n_choices_passes_the_front_end_once() -> None:
    engine = SimEngine(build_parts(CONFIG))
    choices = [SimRequest(request_id=f"c{k}", prompt_token_ids=synthetic_prompt(32, 0),
                          output_tokens=2, finish_reason="length", arrival_s=0.0)
               for k in range(3)]
    engine.submit_call(choices, endpoint="chat")
    assert len(engine.front) == 1 and engine.front.next_done_s() == pytest.approx(
        choices[0].arrival_s + 0.004)
    engine.abort(choices[1])  # a choice gone before the engine saw it never reaches it
    engine._admit(choices[0].arrival_s + 0.01)
    assert list(engine.core.scheduler.waiting) == [choices[0], choices[2]]


def test_capacity_clock_and_replay_agree_with_a_front_end() -> None:
    rng = random.Random(3)
    items = [WorkItem(synthetic_prompt(rng.randint(16, 400), k), rng.randint(1, 40))
             for k in range(40)]
    for work in (0.0, 0.003):
        replay = run_workload(_core(), items, frontend_s=work)
        clock = simulate(_core(), [Arrival(0.0, i.prompt_token_ids, i.output_tokens)
                                   for i in items], frontend_s=work)
        assert statistics.fmean(clock.ttft_s) == pytest.approx(replay.mean_ttft_s, abs=1e-6)
        assert clock.duration_s + PARTS.timing.request_overhead_s == pytest.approx(
            replay.duration_s, abs=1e-6)


@settings(max_examples=8, deadline=None)
@given(st.floats(0.001, 0.01), st.floats(0.1, 0.8))
def test_the_sla_front_end_term_is_the_simulated_queue(work: float, rho: float) -> None:
    """M/G/1-PS: the SLA estimate's mean time in the front end matches the simulated
    processor-sharing queue under Poisson arrivals at utilization `rho`."""
    rate = rho / work
    rng = random.Random(7)
    ps: ProcessorSharing[int] = ProcessorSharing(work)
    t = 0.0
    arrived: dict[int, float] = {}
    sojourn: list[float] = []
    for k in range(6000):
        t += rng.expovariate(rate)
        sojourn += [done - arrived.pop(job) for job, done in ps.advance(t)]
        ps.submit(k, t)
        arrived[k] = t
    sojourn += [done - arrived.pop(job) for job, done in ps.advance(1e9)]
    # the first tenth warms the queue up
    measured = statistics.fmean(sojourn[len(sojourn) // 10:])
    assert measured == pytest.approx(mean_sojourn_s(work, rate), rel=0.15)


def test_the_sla_estimate_adds_the_front_end() -> None:
    toy = ReplicaModel(step_s=lambda b, ctx: 0.010 + 0.001 * b, prefill_s=lambda n: 1e-4 * n,
                       max_num_seqs=64, request_overhead_s=0.001, frontend_s=0.005)
    idle = estimate(toy, rate=0, prompt_tokens=100, output_tokens=10, ttft_target_s=None,
                    itl_target_s=None)
    assert idle.ttft_s == pytest.approx(0.001 + 0.005 + 0.01)
    plain = replace(toy, frontend_s=0.0)
    kw = dict(rate=40.0, prompt_tokens=100, output_tokens=10, ttft_target_s=None,
              itl_target_s=None)
    with_front, without = estimate(toy, **kw), estimate(plain, **kw)  # type: ignore[arg-type]
    assert with_front.replicas == without.replicas
    per_replica = 40.0 / with_front.replicas
    assert with_front.ttft_s - without.ttft_s == pytest.approx(
        0.005 / (1 - per_replica * 0.005))
    assert mean_sojourn_s(0.01, 100.0) == float("inf")


def test_a_traffic_file_names_the_api_its_clients_call() -> None:
    from inferplane.bench.traffic import parse_traffic
    from inferplane.errors import InferplaneError

    row = {"peak_rps": 5, "input_tokens": 100, "output_tokens": 10}
    traffic = parse_traffic({"models": {"a": row, "b": row | {"api": "chat"}}}, "t.yaml")
    assert traffic.models["a"].api == "completions" and traffic.models["b"].api == "chat"
    with pytest.raises(InferplaneError, match="unknown API"):
        parse_traffic({"models": {"a": row | {"api": "responses"}}}, "t.yaml")


async def test_the_http_api_charges_chat_the_template_and_completions_the_tokenizer() -> None:
    """Through the OpenAI routes: the engine's TTFT histogram (simulated clock) holds the
    API server's work, a chat call's template and a completions call's tokenizer."""
    import httpx

    from inferplane.sim.app import EngineApp

    config = replace(CONFIG, calibration=replace(CAL, chat_template_s=0.05, tokenize_s=0.02))
    sums: dict[str, float] = {}
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user",
                                                               "content": "hi"}]}),
                       ("/v1/completions", {"prompt": "hi"})):
        engine = SimEngine(build_parts(config))
        engine.start()
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=EngineApp(engine).app),
                                         base_url="http://sim") as client:
                sent = [client.post(path, json={"model": "m", "max_tokens": 2} | body)
                        for _ in range(3)]
                assert all(r.status_code == 200 for r in await asyncio.gather(*sent))
        finally:
            await engine.stop()
        histogram = engine.metrics.ttft.collect()[0].samples
        sums[path] = next(s.value for s in histogram if s.name.endswith("_sum"))
    # Each call waits at least its own work, and at most 3 x it (never more than 3 share
    # the loop), plus its prefill and the step in flight.
    engine_s = 2 * _replay_ttfts([WorkItem(synthetic_prompt(64, 0), 2)], 0.0)
    for path, work in (("/v1/chat/completions", 0.05), ("/v1/completions", 0.02)):
        assert 3 * work <= sums[path] <= 3 * (3 * work + engine_s), (path, sums[path])


@settings(max_examples=50, deadline=None)
@given(st.floats(0.0, 1e7), st.lists(st.floats(1e-4, 0.05), min_size=1, max_size=6),
       st.lists(st.floats(0.0, 0.01), min_size=6, max_size=6))
def test_processor_sharing_finishes_on_an_absolute_clock(start: float, works: list[float],
                                                         gaps: list[float]) -> None:
    """On the live engine's clock (loop.time(), up to ~1e7 s) serving to each next finishing
    time finishes a job: no pass loses its step to rounding (the engine loop relies on it)."""
    ps: ProcessorSharing[int] = ProcessorSharing(now_s=start)
    t = start
    for k, work in enumerate(works):
        t += gaps[k]
        ps.submit(k, t, work)
    finished: list[int] = []
    for _ in range(len(works)):  # each pass finishes at least one job
        due = ps.next_done_s()
        if due is None:
            break
        finished += [job for job, _ in ps.advance(due)]
    assert sorted(finished) == list(range(len(works))) and len(ps) == 0
