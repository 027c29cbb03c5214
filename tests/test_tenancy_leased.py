"""Several gateways sharing one key through Redis with leased credit (`LeasedRedisLimiter`):
the bounds docs/tenancy.md states ("Several gateways"), on a real Redis. Time is passed in,
never slept; the background sync is off and `sync_all` stands for its ticks."""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import AsyncIterator
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tenancy_fixtures import NO_REDIS, REDIS_URL

from inferplane.tenancy import leased
from inferplane.tenancy.leased import LeasedRedisLimiter
from inferplane.tenancy.limits import CONCURRENCY, OK, REQUESTS, WINDOW_S, Limits

T0 = 1_800_000_000.0
SYNC_S = 0.5

pytestmark = pytest.mark.skipif(not REDIS_URL, reason=NO_REDIS)


def _pair(prefix: str, ttl: float = 30.0) -> tuple[LeasedRedisLimiter, LeasedRedisLimiter]:
    assert REDIS_URL is not None
    return tuple(  # type: ignore[return-value]
        LeasedRedisLimiter(
            REDIS_URL,
            prefix=prefix,
            sync_s=SYNC_S,
            lease_ttl_s=ttl,
            gateway_id=name,
            background=False,
            clock=lambda: T0,  # what `close` settles at
        )
        for name in ("gw-a", "gw-b")
    )


@pytest.fixture
async def gateways() -> AsyncIterator[tuple[LeasedRedisLimiter, LeasedRedisLimiter]]:
    a, b = _pair(f"iptest:{os.urandom(4).hex()}:")
    yield a, b
    await a.clear()
    for lim in (a, b):
        await lim.close()


async def test_two_gateways_share_one_per_minute_allowance(
    gateways: tuple[LeasedRedisLimiter, LeasedRedisLimiter],
) -> None:
    a, b = gateways
    limits = Limits(rpm=30)
    admitted = 0
    for i in range(60):  # alternating, all at one instant
        out = await (a, b)[i % 2].acquire("k", "", limits, 0, T0)
        admitted += out.code == OK
    assert admitted <= 30
    # Credit one gateway still holds goes back at its next sync; then the other gets it.
    await a.sync_all(T0)
    await b.sync_all(T0)
    while (await b.acquire("k", "", limits, 0, T0)).code == OK:
        admitted += 1
    assert admitted == 30
    refused = await a.acquire("k", "", limits, 0, T0)
    assert refused.code == REQUESTS and abs(refused.retry_after_s - 2.0) < 1e-6


async def test_concurrency_is_never_exceeded_and_idle_slots_move(
    gateways: tuple[LeasedRedisLimiter, LeasedRedisLimiter],
) -> None:
    a, b = gateways
    limits = Limits(max_concurrent=3)
    for _ in range(3):
        assert (await a.acquire("k", "", limits, 0, T0)).code == OK
    assert (await b.acquire("k", "", limits, 0, T0)).code == CONCURRENCY
    a.release_now("k", limits, 0, T0)
    # `a` holds the freed slot (idle) until a tick finds it unused since the tick before.
    assert (await b.acquire("k", "", limits, 0, T0)).code == CONCURRENCY
    await a.sync_all(T0 + SYNC_S / 2)  # `a` was busy: it renews
    assert (await b.acquire("k", "", limits, 0, T0 + SYNC_S / 2)).code == CONCURRENCY
    await a.sync_all(T0 + SYNC_S)  # idle for a tick: gives back
    assert (await b.acquire("k", "", limits, 0, T0 + SYNC_S)).code == OK
    assert (await a.acquire("k", "", limits, 0, T0 + SYNC_S)).code == CONCURRENCY


async def test_slots_stay_counted_when_a_keys_limits_change_mid_request(
    gateways: tuple[LeasedRedisLimiter, LeasedRedisLimiter],
) -> None:
    a, b = gateways
    before, after = Limits(max_concurrent=2), Limits(max_concurrent=2, rpm=100)
    assert (await a.acquire("k", "", before, 0, T0)).code == OK
    assert (await a.acquire("k", "", after, 0, T0)).code == OK  # the key was edited
    assert (await b.acquire("k", "", after, 0, T0)).code == CONCURRENCY
    a.release_now("k", before, 0, T0)  # the request admitted under the old limits ends
    for t in (0.25, 0.5):  # two ticks: the old lease settles, then gives its slot back
        await a.sync_all(T0 + t)
    assert (await b.acquire("k", "", after, 0, T0 + 0.5)).code == OK


async def test_a_dead_gateways_slots_free_after_its_heartbeat_expires(
    gateways: tuple[LeasedRedisLimiter, LeasedRedisLimiter],
) -> None:
    a, b = gateways
    limits = Limits(max_concurrent=1)
    assert (await a.acquire("k", "", limits, 0, T0)).code == OK  # then `a` dies
    assert (await b.acquire("k", "", limits, 0, T0 + 29)).code == CONCURRENCY
    assert (await b.acquire("k", "", limits, 0, T0 + 31)).code == OK


async def test_a_live_gateways_heartbeat_keeps_a_long_requests_slot(
    gateways: tuple[LeasedRedisLimiter, LeasedRedisLimiter],
) -> None:
    a, b = gateways
    limits = Limits(max_concurrent=1)
    assert (await a.acquire("k", "", limits, 0, T0)).code == OK
    for t in range(20, 100, 20):  # `a` syncs (its background task) while the request runs
        await a.sync_all(T0 + t)
    assert (await b.acquire("k", "", limits, 0, T0 + 105)).code == CONCURRENCY


async def test_token_corrections_reach_redis_at_the_next_sync(
    gateways: tuple[LeasedRedisLimiter, LeasedRedisLimiter],
) -> None:
    a, b = gateways
    limits = Limits(tpm=1000)
    assert (await a.acquire("k", "", limits, 100, T0)).code == OK
    a.release_now("k", limits, 900, T0)  # the engine says 1000 tokens, not 100
    assert (await b.acquire("k", "", limits, 100, T0)).code == OK  # not settled yet
    await a.sync_all(T0)
    assert (await b.acquire("k", "", limits, 100, T0)).code != OK


async def test_close_gives_everything_back(
    gateways: tuple[LeasedRedisLimiter, LeasedRedisLimiter],
) -> None:
    a, b = gateways
    limits = Limits(rpm=4, max_concurrent=4)
    for _ in range(2):
        assert (await a.acquire("k", "", limits, 0, T0)).code == OK
    a.release_now("k", limits, 0, T0)
    a.release_now("k", limits, 0, T0)
    await a.close()
    # Two requests were served; the other two of the minute and all four slots are free.
    results = [(await b.acquire("k", "", limits, 0, T0)).code for _ in range(3)]
    assert results == [OK, OK, REQUESTS]


async def test_credit_is_not_spent_after_sync_s(
    gateways: tuple[LeasedRedisLimiter, LeasedRedisLimiter],
) -> None:
    """Credit charged a minute ago must not add to a full fresh allowance."""
    a, b = gateways
    limits = Limits(rpm=64)
    for _ in range(4):  # chunks of 1, 2, then 4: `a` keeps 3 requests of credit
        assert (await a.acquire("k", "", limits, 0, T0)).code == OK
    later = T0 + WINDOW_S + 1  # the allowance is full again
    fresh = 0
    while (await b.acquire("k", "", limits, 0, later)).code == OK:
        fresh += 1
    assert (await a.acquire("k", "", limits, 0, later)).code == REQUESTS
    assert fresh <= 64


async def test_a_stale_clock_reading_frees_nothing(
    gateways: tuple[LeasedRedisLimiter, LeasedRedisLimiter],
) -> None:
    """A request whose `now` is a little old when it reaches Redis (it waited for a sync in
    flight) is no clock step back: it once rebased the TAT and admitted extra requests."""
    a, b = gateways
    limits = Limits(rpm=60)
    while (await a.acquire("k", "", limits, 0, T0)).code == OK:
        pass
    assert (await b.acquire("k", "", limits, 0, T0 - 0.5)).code == REQUESTS
    assert (await a.acquire("k", "", limits, 0, T0 + 0.6)).code == REQUESTS
    assert (await a.acquire("k", "", limits, 0, T0 + 1.0)).code == OK


async def test_a_key_over_its_rate_costs_redis_no_call_per_refused_request(
    gateways: tuple[LeasedRedisLimiter, LeasedRedisLimiter],
) -> None:
    a, _ = gateways
    limits = Limits(rpm=6)  # one request per 10 s
    while (await a.acquire("k", "", limits, 0, T0)).code == OK:
        pass
    calls = a.syncs
    for t in (0.1, 0.2, 0.4):
        out = await a.acquire("k", "", limits, 0, T0 + t)
        assert out.code == REQUESTS and abs(out.retry_after_s - (10.0 - t)) < 1e-6
    assert a.syncs == calls
    assert (await a.acquire("k", "", limits, 0, T0 + SYNC_S)).code == REQUESTS
    assert a.syncs == calls + 1  # held for sync_s at most: then Redis is asked again
    assert (await a.acquire("k", "", limits, 0, T0 + 10.0)).code == OK


# ---- the bound, against an oracle --------------------------------------------------------

OPS = st.lists(
    st.tuples(
        st.sampled_from(["acquire", "burst", "burst", "release", "sync"]),
        st.integers(0, 1),  # which gateway
        st.sampled_from([0.0, 0.0, 0.0, 0.01, 0.3, 1.0, 7.0, 61.0]),  # seconds since the last step
        st.integers(1, 40),  # tokens the request estimates (and uses)
        # How stale the request's clock reading is when it reaches Redis (it waited for a
        # sync in flight): requests arrive out of order by a few milliseconds.
        st.sampled_from([0.0, 0.0, 0.002, 0.01]),
    ),
    min_size=1,
    max_size=120,
)


def _most_in(times: list[float], per_min: int, sync_s: float) -> bool:
    """The documented bound: at most per_min × (1 + (L + sync_s) / 60) in any interval of
    length L, for every interval between two admissions."""
    times = sorted(times)
    for i in range(len(times)):
        for j in range(i, len(times)):
            length = times[j] - times[i]
            if j - i + 1 > math.floor(per_min * (1 + (length + sync_s) / WINDOW_S) + 1e-6):
                return False
    return True


def _tokens_in(events: list[tuple[float, int]], per_min: int, sync_s: float) -> bool:
    events = sorted(events)
    for i in range(len(events)):
        total = 0
        for j in range(i, len(events)):
            total += events[j][1]
            length = events[j][0] - events[i][0]
            if total > per_min * (1 + (length + sync_s) / WINDOW_S) + 1e-6:
                return False
    return True


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    OPS,
    st.one_of(st.integers(1, 8), st.integers(16, 40)),
    st.integers(40, 2000),
    st.one_of(st.none(), st.integers(1, 24)),
    st.sampled_from([2, 8]),
)
def test_two_gateways_stay_within_the_documented_bound(
    ops: list[tuple[str, int, float, int, float]],
    rpm: int,
    tpm: int,
    max_concurrent: int | None,
    chunk_divisor: int,
) -> None:
    """Random traffic over two gateways: concurrency never above the limit (exact); requests
    and tokens per minute within rpm × sync_s / 60 (tpm × ...) of an exact limiter. The
    bound holds whatever the chunk size, so chunks of up to half the limit are tried too
    (more credit held per gateway: a harder case than the default eighth)."""

    def cap(limits: Limits) -> int:
        caps = [max(1, n // chunk_divisor) for n in (limits.rpm, limits.max_concurrent) if n]
        return min(caps) if caps else 1 << 20

    with mock.patch.object(leased, "_cap", cap):
        asyncio.run(_scenario(ops, Limits(rpm=rpm, tpm=tpm, max_concurrent=max_concurrent)))


async def _scenario(ops: list[tuple[str, int, float, int, float]], limits: Limits) -> None:
    # Heartbeats never expire here: `sync` steps stand for the background ticks, which a
    # live gateway runs every sync_s (expiry has its own test above).
    gws = _pair(f"iptest:{os.urandom(4).hex()}:", ttl=1e6)
    now = T0
    inside: list[list[int]] = [[], []]  # tokens of each gateway's requests in flight
    admitted: list[float] = []
    tokens: list[tuple[float, int]] = []
    try:
        for kind, g, dt, est, lag in ops:
            now += dt
            gw = gws[g]
            if kind in ("acquire", "burst"):
                for _ in range(8 if kind == "burst" else 1):
                    out = await gw.acquire("k", "", limits, est, now - lag)
                    if out.code == OK:
                        inside[g].append(est)
                        admitted.append(now - lag)
                        tokens.append((now - lag, est))
                    concurrent = len(inside[0]) + len(inside[1])
                    assert limits.max_concurrent is None or concurrent <= limits.max_concurrent
            elif kind == "release" and inside[g]:
                inside[g].pop()
                gw.release_now("k", limits, 0, now)
            elif kind == "sync":
                await gw.sync_all(now)
        assert limits.rpm is not None and limits.tpm is not None
        assert _most_in(admitted, limits.rpm, SYNC_S)
        assert _tokens_in(tokens, limits.tpm, SYNC_S)
    finally:
        await gws[0].clear()
        for gw in gws:
            await gw.close()


async def test_redis_down_admits_and_counts_the_error() -> None:
    """Fail open, as the exact limiter: a sync that cannot reach Redis admits the request
    without limits and counts it (`inferplane_limiter_errors_total`)."""
    import hashlib

    from inferplane.tenancy.keys import KeyPolicy
    from inferplane.tenancy.service import Admission, Tenancy

    down = LeasedRedisLimiter("redis://127.0.0.1:1/0", background=False)  # nothing listens
    tenancy = Tenancy(None, down, auth="on", clock=lambda: T0)
    policy = KeyPolicy("key-1", "team", Limits(rpm=10, max_concurrent=2))
    tenancy.keys = {hashlib.sha256(b"sk-test").hexdigest(): policy}
    adm = await tenancy.admit(b"Bearer sk-test", "m", 10)
    assert isinstance(adm, Admission) and adm.key_id == "key-1" and adm.limits is None
    assert tenancy.limiter_errors == 1
    await down.client.aclose()
