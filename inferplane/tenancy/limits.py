"""Per-key limits: requests/min, tokens/min, concurrent requests (P38) and token budgets.

Rates use GCRA (a token bucket kept as one "theoretical arrival time" per key): a key may
burst its whole per-minute allowance and then refills continuously, like OpenAI's limits.
Tokens are charged with an estimate at admission and corrected with the engine's real
usage afterwards (`release(..., delta_tokens=actual - estimate)`).

A theoretical arrival time is never more than one window ahead of `now` in normal
operation, so one further ahead means the wall clock stepped back (NTP, a VM restored): it
is clamped to one window, and a -1 h step costs a key at most one window of its rate, not
the hour (issue 30 item 12; budgets follow the calendar and keep the wall clock). In Redis
only a TAT more than a window and a second ahead counts as a step back: calls from several
replicas (and a leased sync that waited for another) arrive a few ms out of order.

Two backends run the same algorithm: `MemoryLimiter` for one gateway and `RedisLimiter`
(one Lua script, atomic on the server) when several gateway replicas share limits. Both take
`now` from the caller, so one wall clock (NTP) orders all replicas and tests control time.
In Redis, concurrency is a set of leases that expire after `lease_ttl_s`, so a replica
killed mid-request frees its slots on its own; in memory it is a counter (a dead gateway
takes its counters with it, and the gateway releases every slot in a `finally`).
"""

from __future__ import annotations

import calendar
import math
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

WINDOW_S = 60.0
_OVER = WINDOW_S + 1e-9  # a theoretical arrival time further ahead than this is refused
OK, CONCURRENCY, REQUESTS, TOKENS, BUDGET, TOO_LARGE = 0, 1, 2, 3, 4, 5
REASONS = {
    CONCURRENCY: "concurrent requests",
    REQUESTS: "requests per minute",
    TOKENS: "tokens per minute",
    BUDGET: "token budget",
    TOO_LARGE: "tokens per minute",
}
BUDGET_PERIODS = ("day", "month", "total")


@dataclass(frozen=True, slots=True)
class Limits:
    """One key's limits; None means unlimited."""

    rpm: int | None = None
    tpm: int | None = None
    max_concurrent: int | None = None
    budget_tokens: int | None = None
    budget_period: str = "month"
    # Derived once, read per request: no limit at all; seconds of the window one request /
    # one token uses up (0.0: that limit is off).
    unlimited: bool = field(init=False, compare=False, repr=False)
    request_interval: float = field(init=False, compare=False, repr=False)
    token_interval: float = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        unlimited = not (self.rpm or self.tpm or self.max_concurrent or self.budget_tokens)
        object.__setattr__(self, "unlimited", unlimited)
        object.__setattr__(self, "request_interval", WINDOW_S / self.rpm if self.rpm else 0.0)
        object.__setattr__(self, "token_interval", WINDOW_S / self.tpm if self.tpm else 0.0)


class Outcome(NamedTuple):  # a tuple: built on every admitted request, cheapest to make
    """What a backend decided: `code` is OK or the first limit that refused. For an admitted
    request, how long until each limit is back to full, with the window one request / token
    uses (0.0: that limit is off); what is left is derived only when a header needs it."""

    code: int
    retry_after_s: float = 0.0
    requests_reset_s: float = 0.0
    tokens_reset_s: float = 0.0
    request_interval: float = 0.0
    token_interval: float = 0.0

    @property
    def allowed(self) -> bool:
        return self.code == OK

    @property
    def requests_remaining(self) -> int:
        return _left(self.requests_reset_s, self.request_interval)

    @property
    def tokens_remaining(self) -> int:
        return _left(self.tokens_reset_s, self.token_interval)


def _left(reset_s: float, interval: float) -> int:
    """Requests (tokens) left in the window when the bucket is full again in `reset_s`."""
    if not interval:
        return 0
    return max(0, math.floor((WINDOW_S - reset_s) / interval + 1e-9))


def budget_window(period: str, now: float) -> tuple[str, float | None]:
    """(bucket name, seconds until the bucket ends) for a budget period, in UTC."""
    if period == "total":
        return "total", None
    t = time.gmtime(now)
    if period == "day":
        start = calendar.timegm((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0))
        return time.strftime("%Y-%m-%d", t), start + 86400 - now
    year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    end = calendar.timegm((year, month, 1, 0, 0, 0))
    return time.strftime("%Y-%m", t), end - now


def period_start(period: str, now: float) -> float:
    """When the budget bucket holding `now` began (0 for "total")."""
    if period == "total":
        return 0.0
    t = time.gmtime(now)
    day = t.tm_mday if period == "day" else 1
    return float(calendar.timegm((t.tm_year, t.tm_mon, day, 0, 0, 0)))


class Limiter(Protocol):
    async def acquire(
        self, key_id: str, lease: str, limits: Limits, est_tokens: int, now: float,
        output_tokens: int = 0,
    ) -> Outcome: ...

    async def release(
        self, key_id: str, lease: str, limits: Limits, delta_tokens: int, now: float
    ) -> None: ...

    async def seed_budget(self, key_id: str, bucket: str, used_tokens: int) -> None: ...

    async def close(self) -> None: ...


class KeyState:
    """One key's in-memory limiter state, and GCRA on it. The gateway keeps a reference
    with each cached key, so a request's admission and release need no lookup."""

    __slots__ = ("budget", "in_flight", "req_tat", "tok_tat")

    def __init__(self) -> None:
        self.in_flight = 0  # admitted and not yet released (concurrency)
        self.req_tat = 0.0  # theoretical arrival times (GCRA) for requests and tokens
        self.tok_tat = 0.0
        self.budget: dict[str, int] = {}  # tokens used per budget bucket

    def acquire(
        self, limits: Limits, est_tokens: int, now: float, output_tokens: int = 0
    ) -> Outcome | None:
        """None when admitted (`report` then says what is left), else the refusal.
        `est_tokens` is the whole reservation (prompt estimate plus `output_tokens`, the
        most the request may generate); a budget admits while some of it is left and the
        request's output reservation fits in what is left.
        Written for few bytecodes: it runs on every request (docs/tenancy.md, "Cost on the
        hot path")."""
        max_concurrent = limits.max_concurrent
        if max_concurrent and self.in_flight >= max_concurrent:
            return Outcome(CONCURRENCY, 1.0)
        # GCRA: a key's theoretical arrival time may run at most one window ahead of now.
        ahead = now + WINDOW_S
        if self.req_tat > ahead or self.tok_tat > ahead:  # the clock stepped back (module doc)
            self.req_tat = min(self.req_tat, ahead)
            self.tok_tat = min(self.tok_tat, ahead)
        req_tat = tok_tat = now
        req_interval = limits.request_interval
        if req_interval:
            req_tat = self.req_tat
            req_tat = (req_tat if req_tat > now else now) + req_interval
            if req_tat - now > _OVER:
                return Outcome(REQUESTS, req_tat - now - WINDOW_S)
        tok_interval = limits.token_interval
        if tok_interval:
            cost = est_tokens * tok_interval
            if cost > _OVER:  # more tokens than the whole per-minute allowance
                return Outcome(TOO_LARGE, WINDOW_S)
            tok_tat = self.tok_tat
            tok_tat = (tok_tat if tok_tat > now else now) + cost
            if tok_tat - now > _OVER:
                return Outcome(TOKENS, tok_tat - now - WINDOW_S)
        if limits.budget_tokens:
            bucket, left = budget_window(limits.budget_period, now)
            used = self.budget.get(bucket, 0)
            if used >= limits.budget_tokens or used + output_tokens > limits.budget_tokens:
                return Outcome(BUDGET, left or 0.0)
            self.budget[bucket] = self.budget.get(bucket, 0) + est_tokens
        if max_concurrent:
            self.in_flight += 1
        if req_interval:
            self.req_tat = req_tat
        if tok_interval:
            self.tok_tat = tok_tat
        return None

    def report(self, limits: Limits, now: float) -> Outcome:
        """An admitted request's outcome: when each rate limit is full again (call right
        after a successful `acquire`)."""
        req_interval, tok_interval = limits.request_interval, limits.token_interval
        return Outcome(
            OK, 0.0,
            max(0.0, self.req_tat - now) if req_interval else 0.0,
            max(0.0, self.tok_tat - now) if tok_interval else 0.0,
            req_interval, tok_interval,
        )  # fmt: skip

    def release(self, limits: Limits, delta_tokens: int, now: float) -> None:
        """Free the concurrency slot and correct the token charge by `delta_tokens`."""
        if limits.max_concurrent and self.in_flight:
            self.in_flight -= 1
        if delta_tokens:
            if limits.token_interval:
                self.tok_tat += delta_tokens * limits.token_interval
            if limits.budget_tokens:
                bucket, _ = budget_window(limits.budget_period, now)
                self.budget[bucket] = self.budget.get(bucket, 0) + delta_tokens


class MemoryLimiter:
    """Limits for one gateway process (no I/O, no awaits inside the critical section).
    Leases are not needed here: concurrency is a counter per key."""

    def __init__(self) -> None:
        self._keys: dict[str, KeyState] = {}

    def state(self, key_id: str) -> KeyState:
        """The key's state (created on first use); `Tenancy` holds it with the cached key."""
        st = self._keys.get(key_id)
        if st is None:
            st = self._keys[key_id] = KeyState()
        return st

    async def acquire(
        self, key_id: str, lease: str, limits: Limits, est_tokens: int, now: float,
        output_tokens: int = 0,
    ) -> Outcome:
        st = self.state(key_id)
        refused = st.acquire(limits, est_tokens, now, output_tokens)
        return refused if refused is not None else st.report(limits, now)

    async def release(
        self, key_id: str, lease: str, limits: Limits, delta_tokens: int, now: float
    ) -> None:
        self.state(key_id).release(limits, delta_tokens, now)

    async def seed_budget(self, key_id: str, bucket: str, used_tokens: int) -> None:
        self.state(key_id).budget.setdefault(bucket, used_tokens)

    async def close(self) -> None:
        self._keys.clear()


# KEYS: leases zset, request tat, token tat, budget counter.
# ARGV: now, lease, lease_ttl, est, rpm, tpm, max_concurrent, budget, budget_ttl, window,
#       output (the part of est that is the request's output reservation)
_ACQUIRE = """
local now = tonumber(ARGV[1])
local est = tonumber(ARGV[4])
local rpm = tonumber(ARGV[5])
local tpm = tonumber(ARGV[6])
local maxc = tonumber(ARGV[7])
local budget = tonumber(ARGV[8])
local budget_ttl = tonumber(ARGV[9])
local window = tonumber(ARGV[10])
if maxc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  if redis.call('ZCARD', KEYS[1]) >= maxc then return {'1', '1'} end
end
local req_new = 0
local tok_new = 0
-- a rate's TAT more than a window (and a second) ahead: the wall clock stepped back; rebase
-- on the new one. Not for a reading a few ms old: replicas' calls arrive out of order, and
-- rebasing on the older one handed out the difference again.
for i = 2, 3 do
  local tat = tonumber(redis.call('GET', KEYS[i]) or '0')
  if tat > now + window + 1 then
    redis.call('SET', KEYS[i], string.format('%.17g', now + window), 'PX',
      math.ceil(window * 1000) + 1000)
  end
end
if rpm > 0 then
  req_new = math.max(tonumber(redis.call('GET', KEYS[2]) or '0'), now) + window / rpm
  if req_new - now > window + 1e-9 then return {'2', tostring(req_new - now - window)} end
end
if tpm > 0 then
  if est > tpm then return {'5', tostring(window)} end
  tok_new = math.max(tonumber(redis.call('GET', KEYS[3]) or '0'), now) + est * window / tpm
  if tok_new - now > window + 1e-9 then return {'3', tostring(tok_new - now - window)} end
end
if budget > 0 then
  local used = tonumber(redis.call('GET', KEYS[4]) or '0')
  if used >= budget or used + tonumber(ARGV[11]) > budget then
    return {'4', tostring(math.max(budget_ttl, 0))}
  end
end
if maxc > 0 then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
  redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3])) + 1)
end
if rpm > 0 then
  redis.call('SET', KEYS[2], string.format('%.17g', req_new), 'PX',
    math.ceil((req_new - now) * 1000) + 1000)
end
if tpm > 0 then
  redis.call('SET', KEYS[3], string.format('%.17g', tok_new), 'PX',
    math.ceil((tok_new - now) * 1000) + 1000)
end
if budget > 0 then
  redis.call('INCRBY', KEYS[4], est)
  if budget_ttl > 0 then redis.call('EXPIRE', KEYS[4], math.ceil(budget_ttl) + 86400) end
end
return {'0', '0', string.format('%.17g', req_new), string.format('%.17g', tok_new)}
"""

# KEYS: leases zset, token tat, budget counter. ARGV: lease, delta, tpm, budget, window
_RELEASE = """
redis.call('ZREM', KEYS[1], ARGV[1])
local delta = tonumber(ARGV[2])
local tpm = tonumber(ARGV[3])
if delta ~= 0 and tpm > 0 then
  local tat = redis.call('GET', KEYS[2])
  if tat then
    local ttl = redis.call('PTTL', KEYS[2])
    local new = tonumber(tat) + delta * tonumber(ARGV[5]) / tpm
    if ttl > 0 then
      redis.call('SET', KEYS[2], string.format('%.17g', new), 'PX', ttl)
    end
  end
end
if delta ~= 0 and tonumber(ARGV[4]) > 0 then
  redis.call('INCRBY', KEYS[3], delta)
end
return 0
"""


class RedisLimiter:
    """Limits shared by every gateway replica that points at the same Redis."""

    def __init__(self, url: str, prefix: str = "inferplane:", lease_ttl_s: float = 3600.0) -> None:
        import redis.asyncio as aioredis

        self.prefix = prefix
        self.lease_ttl_s = lease_ttl_s
        # A bounded pool that waits for a free connection instead of failing under bursts.
        pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=64, timeout=5)
        self.client: Any = aioredis.Redis(connection_pool=pool)
        self._acquire = self.client.register_script(_ACQUIRE)
        self._release = self.client.register_script(_RELEASE)

    def _keys(self, key_id: str, limits: Limits, now: float) -> tuple[list[str], float | None]:
        p = f"{self.prefix}{{{key_id}}}:"  # hash tag: one slot per key on Redis Cluster
        bucket, left = (
            budget_window(limits.budget_period, now) if limits.budget_tokens else ("-", None)
        )
        return [p + "leases", p + "req", p + "tok", p + "budget:" + bucket], left

    async def acquire(
        self, key_id: str, lease: str, limits: Limits, est_tokens: int, now: float,
        output_tokens: int = 0,
    ) -> Outcome:
        keys, left = self._keys(key_id, limits, now)
        raw = await self._acquire(
            keys=keys,
            args=[
                repr(now), lease, repr(self.lease_ttl_s), est_tokens, limits.rpm or 0,
                limits.tpm or 0, limits.max_concurrent or 0, limits.budget_tokens or 0,
                repr(left or 0.0), repr(WINDOW_S), output_tokens,
            ],
        )
        code = int(raw[0])
        if code != OK:
            return Outcome(code, float(raw[1]))
        return Outcome(
            OK, 0.0, max(0.0, float(raw[2]) - now), max(0.0, float(raw[3]) - now),
            limits.request_interval, limits.token_interval,
        )  # fmt: skip

    async def release(
        self, key_id: str, lease: str, limits: Limits, delta_tokens: int, now: float
    ) -> None:
        keys, _ = self._keys(key_id, limits, now)
        await self._release(
            keys=[keys[0], keys[2], keys[3]],
            args=[lease, delta_tokens, limits.tpm or 0, limits.budget_tokens or 0, repr(WINDOW_S)],
        )

    async def seed_budget(self, key_id: str, bucket: str, used_tokens: int) -> None:
        await self.client.set(f"{self.prefix}{{{key_id}}}:budget:{bucket}", used_tokens, nx=True)

    async def clear(self) -> None:
        """Delete every key under this limiter's prefix (tests)."""
        async for name in self.client.scan_iter(match=self.prefix + "*"):
            await self.client.delete(name)

    async def close(self) -> None:
        await self.client.aclose()
        await self.client.connection_pool.disconnect()
