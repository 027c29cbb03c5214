"""Routing pieces in isolation: scorers, weighted versions, engine metrics, admission."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from inferplane.errors import InferplaneError
from inferplane.gateway import Backend, GatewayConfig, ModelRoute, WeightedRoute, WeightedTarget
from inferplane.gateway.admission import BATCH, INTERACTIVE, AdmissionQueue, QueueFull, QueueTimeout
from inferplane.gateway.backend import EngineLoad
from inferplane.gateway.engine_metrics import parse_engine_load
from inferplane.gateway.pool import Pool
from inferplane.gateway.scorers import (
    EngineMetricsScorer,
    LeastOutstanding,
    PrefixAffinity,
    RouteContext,
    SessionAffinity,
    pick_best,
)
from inferplane.gateway.state import GatewayState


def backends(n: int) -> list[Backend]:
    return [Backend(f"http://10.0.0.{i}:8000") for i in range(n)]


# ---- least outstanding ------------------------------------------------------------------


def test_least_outstanding_prefers_the_idlest_replica() -> None:
    bs = backends(3)
    bs[0].outstanding, bs[1].outstanding, bs[2].outstanding = 5, 1, 3
    assert pick_best(bs, [LeastOutstanding(default_cap=10)], RouteContext(), 0) is bs[1]


def test_ties_rotate_instead_of_piling_onto_the_first_replica() -> None:
    bs = backends(3)
    picked = {pick_best(bs, [LeastOutstanding(10)], RouteContext(), turn).url for turn in range(3)}
    assert len(picked) == 3


def test_pool_spreads_load_and_respects_the_concurrency_cap() -> None:
    pool = Pool(ModelRoute("m", max_concurrency_per_replica=2))
    pool.set_backends(backends(2))
    got = [pool.try_acquire(RouteContext()) for _ in range(5)]
    assert [b.outstanding for b in pool.backends] == [2, 2]
    assert got[4] is None  # both at cap: the caller queues
    pool.release(got[0])  # type: ignore[arg-type]
    assert pool.try_acquire(RouteContext()) is got[0]


def test_unready_and_ejected_replicas_are_not_candidates() -> None:
    pool = Pool(ModelRoute("m"))
    a, b, c = backends(3)
    b.ready = False
    pool.set_backends([a, b, c])
    pool.backends[2].ejected = True
    assert pool.candidates() == [pool.backends[0]]


def test_set_backends_keeps_live_counters_of_known_urls() -> None:
    pool = Pool(ModelRoute("m", endpoints=("http://a:1",)))
    held = pool.try_acquire(RouteContext())
    assert held is not None
    pool.set_backends([Backend("http://a:1", ready=True), Backend("http://b:1")])
    assert pool.backends[0] is held and held.outstanding == 1
    pool.release(held)
    assert held.outstanding == 0


# ---- engine metrics ---------------------------------------------------------------------

V1_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} 1.0
"""


def test_engine_metrics_current_names_summed_over_engines() -> None:
    load = parse_engine_load(V1_METRICS, now=10.0)
    assert load == EngineLoad(waiting=4.0, running=5.0, kv_usage=0.5, awake=True, read_at=10.0)


def test_engine_metrics_fall_back_to_the_older_kv_name() -> None:
    text = (
        "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:gpu_cache_usage_perc 0.7\n"
    )
    load = parse_engine_load(text, now=0.0)
    assert load is not None and load.kv_usage == pytest.approx(0.7)


def test_engine_metrics_without_queue_gauges_are_unusable_not_idle() -> None:
    assert parse_engine_load("vllm:kv_cache_usage_perc 0.1\n", now=0.0) is None
    load = parse_engine_load("vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n", 0.0)
    assert load is not None and load.kv_usage == 1.0  # missing KV gauge reads as full


def test_sleeping_engine_is_flagged() -> None:
    text = V1_METRICS.replace('sleep_state="awake"} 1.0', 'sleep_state="awake"} 0.0')
    load = parse_engine_load(text, now=0.0)
    assert load is not None and not load.awake


def test_engine_scorer_prefers_short_queues_and_counts_stale_replicas_as_saturated() -> None:
    unusable: list[tuple[str, str]] = []
    scorer = EngineMetricsScorer(
        stale_after_s=5.0, on_unusable=lambda b, r: unusable.append((b.url, r))
    )
    busy, idle, stale, missing = backends(4)
    busy.engine = EngineLoad(waiting=8, running=10, kv_usage=0.9, awake=True, read_at=99.0)
    idle.engine = EngineLoad(waiting=0, running=1, kv_usage=0.1, awake=True, read_at=99.0)
    stale.engine = EngineLoad(waiting=0, running=0, kv_usage=0.0, awake=True, read_at=1.0)
    scores = scorer.score([busy, idle, stale, missing], RouteContext(now=100.0))
    assert scores[1] > scores[0] > 0
    assert scores[2] == scores[3] == 0.0
    assert sorted(r for _, r in unusable) == ["missing", "stale"]
    chosen = pick_best([busy, idle, stale, missing], [scorer], RouteContext(now=100.0), 0)
    assert chosen is idle


# ---- prefix and session affinity ---------------------------------------------------------


def test_prefix_affinity_keeps_a_prefix_on_one_replica_until_its_load_bound() -> None:
    bs = backends(4)
    scorer = PrefixAffinity(load_factor=1.25)
    scorer.set_pool([b.url for b in bs])
    ctx = RouteContext(prefix_key=b"system: you are a helpful assistant")
    chosen = [pick_best(bs, [scorer, LeastOutstanding(1000, 0.1)], ctx, 0) for _ in range(3)]
    assert len({b.url for b in chosen}) == 1  # same prefix, same replica
    home = chosen[0]
    # Load the home replica above 1.25x the average: the prefix spills to the next one.
    home.outstanding = 10
    for b in bs:
        if b is not home:
            b.outstanding = 1
    spilled = pick_best(bs, [scorer, LeastOutstanding(1000, 0.1)], ctx, 0)
    assert spilled is not home
    home.outstanding = 1  # back under the bound: it returns home
    assert pick_best(bs, [scorer, LeastOutstanding(1000, 0.1)], ctx, 0) is home


def test_prefix_placement_agrees_across_gateway_replicas_and_spreads_prefixes() -> None:
    urls = [b.url for b in backends(4)]
    first, second = PrefixAffinity(1.25), PrefixAffinity(1.25)
    first.set_pool(urls)
    second.set_pool(list(reversed(urls)))  # another gateway, URLs listed in another order
    homes: Counter[str] = Counter()
    for i in range(400):
        ctx = RouteContext(prefix_key=f"tenant-{i} system prompt".encode())
        a = pick_best(backends(4), [first], ctx, 0).url
        b = pick_best(backends(4), [second], ctx, 0).url
        assert a == b
        homes[a] += 1
    assert len(homes) == 4 and min(homes.values()) > 40


def test_session_affinity_pins_a_session_while_its_replica_is_a_candidate() -> None:
    bs = backends(3)
    scorer = SessionAffinity()
    scorer.set_pool([b.url for b in bs])
    ctx = RouteContext(session=b"user-42")
    home = pick_best(bs, [scorer, LeastOutstanding(100, 0.1)], ctx, 0)
    home.outstanding = 50  # busy, but still a candidate: the session stays
    assert pick_best(bs, [scorer, LeastOutstanding(100, 0.1)], ctx, 1) is home
    others = [b for b in bs if b is not home]
    assert pick_best(others, [scorer], ctx, 0) in others  # gone: falls back


# ---- weighted versions ------------------------------------------------------------------


def test_weighted_split_within_two_percent_over_10k_decisions() -> None:
    config = GatewayConfig(
        models=(ModelRoute("llama-v1"), ModelRoute("llama-v2")),
        routes=(
            WeightedRoute("llama", (WeightedTarget("llama-v1", 95), WeightedTarget("llama-v2", 5))),
        ),
    )
    state = GatewayState(config)
    counts = Counter(state.resolve("llama").route.name for _ in range(10_000))  # type: ignore[union-attr]
    assert abs(counts["llama-v2"] / 10_000 - 0.05) <= 0.02
    assert abs(counts["llama-v1"] / 10_000 - 0.95) <= 0.02
    state.set_weights("llama", [WeightedTarget("llama-v1", 1), WeightedTarget("llama-v2", 1)])
    counts = Counter(state.resolve("llama").route.name for _ in range(10_000))  # type: ignore[union-attr]
    assert counts["llama-v1"] == counts["llama-v2"] == 5_000


def test_a_route_may_split_traffic_of_an_existing_model_name() -> None:
    config = GatewayConfig(
        models=(ModelRoute("chat"), ModelRoute("chat-canary")),
        routes=(
            WeightedRoute("chat", (WeightedTarget("chat", 3), WeightedTarget("chat-canary", 1))),
        ),
    )
    state = GatewayState(config)
    names = Counter(state.resolve("chat").route.name for _ in range(400))  # type: ignore[union-attr]
    assert names == {"chat": 300, "chat-canary": 100}
    assert state.resolve("chat-canary").route.name == "chat-canary"  # type: ignore[union-attr]


def test_aliases_resolve_and_unknown_names_do_not() -> None:
    state = GatewayState(GatewayConfig(models=(ModelRoute("llama-8b", aliases=("chat",)),)))
    assert state.resolve("chat") is state.resolve("llama-8b") is not None
    assert state.resolve("gpt-4") is None  # never a fallback (P36)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"models": (ModelRoute("a", aliases=("x",)), ModelRoute("b", aliases=("x",)))},
        {"models": (ModelRoute("a"),), "routes": (WeightedRoute("r", (WeightedTarget("zz", 1),)),)},
        {"max_body_bytes": 10},
    ],
)
def test_bad_gateway_config_names_the_problem(kwargs: dict[str, object]) -> None:
    with pytest.raises(InferplaneError) as info:
        GatewayConfig(**kwargs)  # type: ignore[arg-type]
    assert info.value.fix


def test_bad_route_config_names_the_problem() -> None:
    with pytest.raises(InferplaneError, match="scorer"):
        ModelRoute("m", scorers=("random",))
    with pytest.raises(InferplaneError, match="sum to zero"):
        WeightedRoute("r", (WeightedTarget("a", 0),))


# ---- admission queue --------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_queue(
    depth: int = 10, wait: float = 30.0, clock: FakeClock | None = None
) -> tuple[AdmissionQueue[str], list[str]]:
    abandoned: list[str] = []
    q: AdmissionQueue[str] = AdmissionQueue(depth, wait, 2.0, abandoned.append, clock)
    return q, abandoned


async def _enqueue(q: AdmissionQueue[str], priority: int, label: str) -> asyncio.Task[str]:
    task = asyncio.get_running_loop().create_task(q.wait(priority, label))
    await asyncio.sleep(0)
    return task


async def test_interactive_is_served_before_batch() -> None:
    clock = FakeClock()
    q, _ = make_queue(clock=clock)
    batch = await _enqueue(q, BATCH, "batch")
    clock.now = 1.0
    inter = await _enqueue(q, INTERACTIVE, "inter")
    head = q.head()
    assert head is not None and head.ctx == "inter"
    q.grant(head, "slot-1")
    assert await inter == "slot-1"
    head = q.head()
    assert head is not None
    q.grant(head, "slot-2")
    assert await batch == "slot-2"


async def test_batch_that_waited_past_the_head_start_is_not_starved() -> None:
    clock = FakeClock()
    q, _ = make_queue(clock=clock)
    batch = await _enqueue(q, BATCH, "batch")
    clock.now = 5.0  # longer than the 2 s head start
    await _enqueue(q, INTERACTIVE, "late-interactive")
    head = q.head()
    assert head is not None and head.ctx == "batch"
    q.grant(head, "slot")
    assert await batch == "slot"
    for task in asyncio.all_tasks() - {asyncio.current_task()}:
        task.cancel()


async def test_full_queue_refuses_and_timeout_expires() -> None:
    q, _ = make_queue(depth=1, wait=0.05)
    first = await _enqueue(q, INTERACTIVE, "a")
    with pytest.raises(QueueFull):
        await q.wait(INTERACTIVE, "b")
    with pytest.raises(QueueTimeout):
        await first
    assert len(q) == 0


async def test_cancelled_waiter_leaves_and_a_late_grant_is_handed_back() -> None:
    q, abandoned = make_queue()
    waiter = await _enqueue(q, INTERACTIVE, "a")
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert len(q) == 0 and q.head() is None
    # Granted and cancelled in the same tick: the slot goes back to the pool.
    waiter = await _enqueue(q, INTERACTIVE, "b")
    head = q.head()
    assert head is not None
    q.grant(head, "slot")
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert abandoned == ["slot"]


async def test_pool_hands_a_freed_slot_to_the_queued_request() -> None:
    pool = Pool(ModelRoute("m", endpoints=("http://a:1",), max_concurrency_per_replica=1))
    held = await pool.acquire(RouteContext(), INTERACTIVE)
    queued = asyncio.get_running_loop().create_task(pool.acquire(RouteContext(), INTERACTIVE))
    await asyncio.sleep(0)
    assert len(pool.queue) == 1 and not queued.done()
    pool.release(held)
    assert await queued is held and held.outstanding == 1
