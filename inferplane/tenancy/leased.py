"""Limits shared through Redis, decided in memory: each gateway leases chunks of a key's
allowance and settles with Redis once per `sync_s`, not once per request.

Per key, a gateway holds credit (requests, tokens, budget tokens) and concurrency slots
that Redis granted it. A request that fits its gateway's credit is decided without I/O;
one that does not triggers a sync for its key (one Lua script: apply the token corrections
of finished requests, give back what is left, grant what the request needs plus a chunk
sized by the key's recent traffic, or refuse with the limit that refused). A background
task syncs every key with anything outstanding every `sync_s` / 2 and renews the credit
of keys in use, so a busy key costs about 2 / `sync_s` round trips a second per gateway.

The bounds (docs/tenancy.md, "Several gateways"), for any number of gateways on one key:

- Requests and tokens per minute: Redis charges a chunk with the same GCRA as the exact
  limiter at the moment it grants it, and a chunk is used for at most `sync_s` after
  that (then what is left goes back, as far as it has not refilled meanwhile). So the
  requests admitted in any interval of length L are at most what exact GCRA admits in
  L + `sync_s`: rpm × (1 + (L + sync_s) / 60), i.e. at most rpm × sync_s / 60 more than
  the exact limiter. Token corrections (engine
  usage vs estimate) reach Redis within `sync_s` (the exact limiter applies them at once).
- Concurrency: the slots every gateway holds never sum above `max_concurrent`, so it is
  never exceeded. A request may be refused while another gateway holds idle slots; it
  gives them back within `sync_s`. A gateway that dies holds its slots until its
  heartbeat (each sync) is `lease_ttl_s` old.
- Budgets: credit is granted only out of what is left, with the exact limiter's rule
  (admit while some is left and the output reservation fits, charge the estimate), so a
  budget is overshot no more than by the exact limiter.

A key refused for its request rate is refused by its gateway without a Redis call until
the retry time or `sync_s` (whichever is first), so a client hammering a key over its limit
costs Redis at most 1 / `sync_s` calls a second per gateway, not one per request.

A single gateway decides as the exact limiter does at one instant; across time it may admit
up to the bound above more (a chunk charged earlier refills earlier).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from collections.abc import Callable
from typing import Any

from inferplane.aio import cancel_and_wait
from inferplane.tenancy.limits import (
    OK,
    REQUESTS,
    WINDOW_S,
    Limits,
    Outcome,
    budget_window,
)

log = logging.getLogger("inferplane.tenancy")

# KEYS: 1 slots held per gateway (hash), 2 gateway heartbeats (zset), 3 request TAT,
#       4 token TAT, 5 budget bucket to grant from, 6.. budget buckets to adjust.
# ARGV: 1 now, 2 gateway, 3 heartbeat ttl, 4 window,
#       5 rpm, 6 tpm, 7 max_concurrent, 8 budget, 9 budget bucket ttl,
#       10 requests to give back, 11 tokens to give back (credit + corrections, signed),
#       12 slots this gateway keeps (its requests in flight: absolute, so a retried or
#          expired heartbeat cannot lose them),
#       13 requests needed, 14 requests wanted, 15 tokens needed, 16 tokens wanted,
#       17 slots needed, 18 slots wanted, 19 budget needed (estimate), 20 budget wanted,
#       21 output reservation, 22.. amounts for KEYS[6..] (signed INCRBY)
# Returns {code, retry_after, requests, tokens, slots, budget, req_tat, tok_tat}: what
# was granted (all of it or, with code ~= 0, nothing).
_SYNC = """
local now = tonumber(ARGV[1])
local gw = ARGV[2]
local ttl = tonumber(ARGV[3])
local window = tonumber(ARGV[4])
local rpm, tpm = tonumber(ARGV[5]), tonumber(ARGV[6])
local maxc, budget = tonumber(ARGV[7]), tonumber(ARGV[8])
local budget_ttl = tonumber(ARGV[9])
local function num(key) return tonumber(redis.call('GET', key) or '0') end
local function set_tat(key, tat)
  redis.call('SET', key, string.format('%.17g', tat), 'PX',
    math.max(math.ceil((tat - now) * 1000), 0) + 1000)
end
-- 1. what this gateway gives back: unused credit, token corrections, idle slots
for i = 6, #KEYS do
  local amount = tonumber(ARGV[16 + i])
  if amount ~= 0 then redis.call('INCRBY', KEYS[i], amount) end
end
for _, spec in ipairs({{3, 10, rpm}, {4, 11, tpm}}) do
  local back = tonumber(ARGV[spec[2]])
  if back ~= 0 and spec[3] > 0 and redis.call('EXISTS', KEYS[spec[1]]) == 1 then
    set_tat(KEYS[spec[1]], num(KEYS[spec[1]]) - back * window / spec[3])
  end
end
local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, g in ipairs(dead) do redis.call('HDEL', KEYS[1], g) end
if #dead > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now) end
local held = tonumber(ARGV[12])
-- this gateway's slots and heartbeat (an expired heartbeat frees a dead gateway's slots)
local function keep()
  if held > 0 then
    redis.call('HSET', KEYS[1], gw, held)
    redis.call('ZADD', KEYS[2], now + ttl, gw)
    redis.call('EXPIRE', KEYS[1], math.ceil(ttl) + 1)
    redis.call('EXPIRE', KEYS[2], math.ceil(ttl) + 1)
  else
    redis.call('HDEL', KEYS[1], gw)
    redis.call('ZREM', KEYS[2], gw)
  end
end
local function refuse(code, retry)
  keep()
  return {code, string.format('%.17g', retry)}
end
-- 2. clock stepped back: a TAT more than a window (and a second) ahead is rebased, as the
--    exact limiter does; a reading a few ms old (it waited for a sync) is no step back
for i = 3, 4 do
  if num(KEYS[i]) > now + window + 1 then set_tat(KEYS[i], now + window) end
end
-- 3. grant what is needed (refuse otherwise) plus up to the wanted chunk; a sync that
--    needs nothing (the background renewal) takes what there is, refusing nothing
local slots, reqs, toks, credit = 0, 0, 0, 0
local need_s, want_s = tonumber(ARGV[17]), tonumber(ARGV[18])
if maxc > 0 and want_s > 0 then
  local total = held
  for _, n in ipairs(redis.call('HVALS', KEYS[1])) do total = total + tonumber(n) end
  total = total - tonumber(redis.call('HGET', KEYS[1], gw) or '0')
  local free = maxc - total
  if free < need_s then return refuse('1', 1) end
  slots = math.max(0, math.min(want_s, free))
end
local req_base, tok_base = now, now
local need_r, want_r = tonumber(ARGV[13]), tonumber(ARGV[14])
if rpm > 0 and want_r > 0 then
  local interval = window / rpm
  req_base = math.max(num(KEYS[3]), now)
  local room = math.floor((now + window - req_base + 1e-6) / interval)
  if room < need_r then
    return refuse('2', req_base + need_r * interval - now - window)
  end
  reqs = math.max(0, math.min(want_r, room))
end
local need_t, want_t = tonumber(ARGV[15]), tonumber(ARGV[16])
if tpm > 0 and want_t > 0 then
  local interval = window / tpm
  if need_t > tpm then return refuse('5', window) end
  tok_base = math.max(num(KEYS[4]), now)
  local room = math.floor((now + window - tok_base + 1e-6) / interval)
  if room < need_t then
    return refuse('3', tok_base + need_t * interval - now - window)
  end
  toks = math.max(0, math.min(want_t, room))
end
local need_b, want_b = tonumber(ARGV[19]), tonumber(ARGV[20])
if budget > 0 and want_b > 0 then
  local used = num(KEYS[5])
  if need_b > 0 and (used >= budget or used + tonumber(ARGV[21]) > budget) then
    return refuse('4', math.max(budget_ttl, 0))
  end
  -- the estimate is charged whole (as the exact limiter); a chunk only out of what is left
  credit = math.max(need_b, math.min(want_b, budget - used))
  if credit > 0 then
    redis.call('INCRBY', KEYS[5], credit)
    if budget_ttl > 0 then redis.call('EXPIRE', KEYS[5], math.ceil(budget_ttl) + 86400) end
  else
    credit = 0
  end
end
held = held + slots
keep()
local req_tat, tok_tat = num(KEYS[3]), num(KEYS[4])
if reqs > 0 then
  req_tat = req_base + reqs * window / rpm
  set_tat(KEYS[3], req_tat)
end
if toks > 0 then
  tok_tat = tok_base + toks * window / tpm
  set_tat(KEYS[4], tok_tat)
end
return {'0', '0', tostring(reqs), tostring(toks), tostring(slots), tostring(credit),
  string.format('%.17g', req_tat), string.format('%.17g', tok_tat)}
"""


_NOT_REFUSED = (0.0, 0.0, 0.0)


class Lease:
    """What one gateway holds for one key, and what it owes Redis."""

    __slots__ = (
        "avg_tokens", "budget", "budget_bucket", "corrections", "expires", "granted", "held",
        "holder", "in_flight", "limits", "refused", "req_chunk", "req_tat", "requests",
        "sync_lock", "tok_tat", "tokens", "used_requests", "used_tokens",
    )  # fmt: skip

    def __init__(self, limits: Limits, holder: str) -> None:
        self.limits = limits
        self.holder = holder  # this lease's name in Redis's slot hash and heartbeats
        self.requests = 0  # request credit
        self.tokens = 0  # token credit
        self.budget = 0  # budget credit (tokens), in `budget_bucket`
        self.budget_bucket = ""
        self.held = 0  # concurrency slots held
        self.in_flight = 0  # of which in use
        self.granted = 0.0  # credit is usable from `granted` until `expires` (sync_s)
        self.expires = 0.0
        self.corrections: dict[str, int] = {}  # budget bucket -> tokens owed (signed)
        # Redis's TATs right after the last grant: where this gateway's chunk ends (how much
        # of it may go back, and the x-ratelimit-* reset times).
        self.req_tat = 0.0
        self.tok_tat = 0.0
        self.used_requests = 0  # admitted since the last background sync (chunk sizing)
        self.used_tokens = 0
        self.avg_tokens = 0  # tokens per request in the last interval (0: not known yet)
        self.req_chunk = 1
        self.sync_lock = asyncio.Lock()
        # (when, until, retry at): Redis refused this key's request rate at `when`; until
        # `until` (at most sync_s, at most the retry) requests are refused without a call.
        self.refused = _NOT_REFUSED


_TOK = "\x00tok"  # the token-rate correction in `Lease.corrections` (never a bucket name)


def _cap(limits: Limits) -> int:
    """The largest chunk of requests (and slots) one gateway takes: an eighth of the key's
    allowance, so one gateway cannot starve the others."""
    caps = [max(1, n // 8) for n in (limits.rpm, limits.max_concurrent) if n]
    return min(caps) if caps else 1 << 20


class LeasedRedisLimiter:
    """The `Limiter` protocol over Redis, deciding in memory from leased credit."""

    def __init__(
        self,
        url: str,
        prefix: str = "inferplane:",
        sync_s: float = 0.5,
        lease_ttl_s: float = 30.0,
        gateway_id: str | None = None,
        clock: Callable[[], float] = time.time,
        background: bool = True,
    ) -> None:
        import redis.asyncio as aioredis

        if sync_s <= 0 or lease_ttl_s <= sync_s:
            raise ValueError("need 0 < sync_s < lease_ttl_s")
        self.prefix = prefix
        self.sync_s = sync_s
        self.lease_ttl_s = lease_ttl_s
        self.gateway_id = gateway_id or os.urandom(6).hex()
        self.clock = clock
        self.background = background
        pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=16, timeout=5)
        self.client: Any = aioredis.Redis(connection_pool=pool)
        self._sync = self.client.register_script(_SYNC)
        self._leases: dict[str, Lease] = {}
        self._serial = 0  # leases made: each holds its slots under its own name in Redis
        self._task: asyncio.Task[None] | None = None
        self.syncs = 0  # Redis round trips (tests, docs)

    # ---- the request path ------------------------------------------------------------

    def try_acquire(
        self, key_id: str, limits: Limits, est_tokens: int, now: float, output_tokens: int = 0
    ) -> Outcome | None:
        """Admit from this gateway's credit without I/O, or None: a sync is needed."""
        st = self._leases.get(key_id)
        if st is None or not st.granted <= now < st.expires:
            return None
        if st.limits is not limits and st.limits != limits:
            return None
        if limits.max_concurrent and st.in_flight >= st.held:
            return None
        if limits.rpm and st.requests < 1:
            return None
        if limits.tpm and st.tokens < est_tokens:
            return None
        if limits.budget_tokens:
            bucket, _ = budget_window(limits.budget_period, now)
            if bucket != st.budget_bucket or st.budget < est_tokens or st.budget <= 0:
                return None
            st.budget -= est_tokens
        if limits.max_concurrent:
            st.in_flight += 1
        if limits.rpm:
            st.requests -= 1
        if limits.tpm:
            st.tokens -= est_tokens
        st.used_requests += 1
        st.used_tokens += est_tokens
        return self._report(st, limits, now)

    async def acquire(
        self,
        key_id: str,
        lease: str,
        limits: Limits,
        est_tokens: int,
        now: float,
        output_tokens: int = 0,
    ) -> Outcome:
        """Admit from credit, else sync the key with Redis (waiting for a sync already in
        flight for it) and decide from what Redis granted."""
        if self.background and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        while True:
            out = self.try_acquire(key_id, limits, est_tokens, now, output_tokens)
            if out is not None:
                return out
            st = self._leases.get(key_id)
            if st is None or (st.limits is not limits and st.limits != limits):
                st = self._leases[key_id] = self._replace(key_id, st, limits)
            since, until, retry_at = st.refused
            if since <= now < until:  # Redis refused the rate just now: no call per request
                return Outcome(REQUESTS, retry_at - now)
            lock = st.sync_lock
            if lock.locked():  # another request is syncing this key: its grant may do
                async with lock:
                    pass
                continue
            async with lock:
                refused = await self._sync_key(key_id, st, now, est_tokens, output_tokens)
            if refused is not None:
                return refused
            out = self.try_acquire(key_id, limits, est_tokens, now, output_tokens)
            if out is None:  # a grant always covers the request that asked: never spin
                raise RuntimeError(f"limiter: Redis granted too little for key {key_id}")
            return out

    def _replace(self, key_id: str, old: Lease | None, limits: Limits) -> Lease:
        """A fresh lease for changed limits; the old one's credit and slots go back at the
        next background sync (kept under a private name until then)."""
        if old is not None:
            self._leases[f"{key_id}\x00old{id(old)}"] = old
        self._serial += 1
        return Lease(limits, f"{self.gateway_id}:{self._serial}")

    def release_now(self, key_id: str, limits: Limits, delta_tokens: int, now: float) -> None:
        """Free the request's slot and owe Redis its token correction (next sync)."""
        st = self._leases.get(key_id)
        if st is None or (st.limits is not limits and st.limits != limits):
            st = self._find(key_id, limits)
            if st is None:
                return
        if limits.max_concurrent and st.in_flight:
            st.in_flight -= 1
        if delta_tokens:
            if limits.tpm:
                st.corrections[_TOK] = st.corrections.get(_TOK, 0) + delta_tokens
            if limits.budget_tokens:
                bucket, _ = budget_window(limits.budget_period, now)
                st.corrections[bucket] = st.corrections.get(bucket, 0) + delta_tokens

    def _find(self, key_id: str, limits: Limits) -> Lease | None:
        prefix = key_id + "\x00old"
        for name, st in self._leases.items():
            if name.startswith(prefix) and st.limits == limits:
                return st
        return None

    async def release(
        self, key_id: str, lease: str, limits: Limits, delta_tokens: int, now: float
    ) -> None:
        self.release_now(key_id, limits, delta_tokens, now)

    @staticmethod
    def _report(st: Lease, limits: Limits, now: float) -> Outcome:
        """When each rate is full again: Redis's TAT at the last grant, less the credit this
        gateway still holds (exact with one gateway)."""
        req_i, tok_i = limits.request_interval, limits.token_interval
        return Outcome(
            OK, 0.0,
            max(0.0, st.req_tat - st.requests * req_i - now) if req_i else 0.0,
            max(0.0, st.tok_tat - st.tokens * tok_i - now) if tok_i else 0.0,
            req_i, tok_i,
        )  # fmt: skip

    # ---- syncing with Redis ----------------------------------------------------------

    def _keys(self, key_id: str) -> list[str]:
        p = f"{self.prefix}{{{key_id}}}:"  # hash tag: one slot per key on Redis Cluster
        return [p + "held", p + "gateways", p + "req", p + "tok"]

    async def _sync_key(
        self,
        key_id: str,
        st: Lease,
        now: float,
        est_tokens: int = 0,
        output_tokens: int = 0,
        need: bool = True,
        renew: bool = True,
    ) -> Outcome | None:
        """One round trip: settle `st` with Redis and, with `need`, get credit for one
        request of `est_tokens` plus a chunk (refused if even the request does not fit);
        without `need` but with `renew`, a chunk of whatever is left. Returns the refusal,
        or None."""
        limits = st.limits
        name = key_id.split("\x00", 1)[0]
        p = f"{self.prefix}{{{name}}}:budget:"
        bucket, left = (
            budget_window(limits.budget_period, now) if limits.budget_tokens else ("-", None)
        )
        # Take everything owed and given back out of the lease before awaiting: requests
        # running meanwhile must not spend credit this sync returns.
        corrections, st.corrections = st.corrections, {}
        requests, tokens, budget = st.requests, st.tokens, st.budget
        # Only the part of a chunk still ahead of `now` on Redis's TAT goes back: the rest
        # has refilled meanwhile, and returning it would credit the key twice.
        if requests:
            ahead = (st.req_tat - now) / limits.request_interval if limits.rpm else 0.0
            requests = min(requests, max(0, math.floor(ahead + 1e-9)))
        if tokens:
            ahead = (st.tok_tat - now) / limits.token_interval if limits.tpm else 0.0
            tokens = min(tokens, max(0, math.floor(ahead + 1e-9)))
        st.requests = st.tokens = st.budget = 0
        st.held = st.in_flight
        adjust = {b: n for b, n in corrections.items() if b != _TOK}
        if budget and st.budget_bucket:
            adjust[st.budget_bucket] = adjust.get(st.budget_bucket, 0) - budget
        names = list(adjust)
        chunk = st.req_chunk
        used = st.used_requests
        avg = max(1, math.ceil(st.used_tokens / used) if used else st.avg_tokens or est_tokens)
        want = need or renew
        est = est_tokens if need else avg
        need_req = 1 if need and limits.rpm else 0
        need_tok = est_tokens if need and limits.tpm else 0
        need_slot = 1 if need and limits.max_concurrent else 0
        need_budget = max(est_tokens, 1) if need and limits.budget_tokens else 0
        more = est + (chunk - 1) * avg  # tokens for `chunk` requests
        tpm, budget_tokens = limits.tpm or 0, limits.budget_tokens or 0
        want_req = max(need_req, chunk) if want and limits.rpm else 0
        want_tok = max(need_tok, min(more, tpm // 8)) if want and tpm else 0
        want_slot = max(need_slot, chunk) if want and limits.max_concurrent else 0
        want_budget = (
            max(need_budget, min(more, budget_tokens // 8)) if want and budget_tokens else 0
        )
        try:
            raw = await self._sync(
                keys=[*self._keys(name), p + bucket, *(p + b for b in names)],
                args=[
                    repr(now), st.holder, repr(self.lease_ttl_s), repr(WINDOW_S),
                    limits.rpm or 0, tpm, limits.max_concurrent or 0, budget_tokens,
                    repr(left or 0.0), requests, tokens - corrections.get(_TOK, 0),
                    st.held, need_req, want_req, need_tok, want_tok, need_slot, want_slot,
                    need_budget, want_budget, output_tokens, *(adjust[b] for b in names),
                ],
            )  # fmt: skip
        except BaseException:
            # Unknown whether Redis applied it: corrections are owed again (applied twice
            # at worst); the credit is not reused (lost at worst: never over-admits).
            for b, n in corrections.items():
                st.corrections[b] = st.corrections.get(b, 0) + n
            raise
        self.syncs += 1
        code = int(raw[0])
        if code != OK:
            retry = float(raw[1])
            if code == REQUESTS:  # nothing fits before `retry`: refuse locally meanwhile
                st.refused = (now, now + min(retry, self.sync_s), now + retry)
            return Outcome(code, retry)
        st.refused = _NOT_REFUSED
        st.requests, st.tokens = int(raw[2]), int(raw[3])
        st.held += int(raw[4])
        st.budget, st.budget_bucket = int(raw[5]), bucket
        st.req_tat, st.tok_tat = float(raw[6]), float(raw[7])
        st.granted, st.expires = now, now + self.sync_s
        if need:  # ran out before the next tick: twice the chunk next time
            st.req_chunk = min(chunk * 2, _cap(limits))
        return None

    def _outstanding(self, st: Lease) -> bool:
        return bool(
            st.requests or st.tokens or st.budget or st.held or st.corrections
            or st.used_requests
        )  # fmt: skip

    async def sync_all(self, now: float | None = None, renew: bool = True) -> None:
        """Settle every key with anything outstanding (the background task, every
        `sync_s` / 2, so credit in use is renewed before it is `sync_s` old; `close`
        with `renew=False`): give back credit and idle slots, pay corrections, renew the
        heartbeat and, for a key used since the last tick, take the next chunk."""
        now = self.clock() if now is None else now
        for key_id, st in list(self._leases.items()):
            if not self._outstanding(st):
                if "\x00" in key_id or st.in_flight == 0:
                    self._leases.pop(key_id, None)
                continue
            used = st.used_requests
            if used:  # enough for the next tick interval, twice over
                st.avg_tokens = math.ceil(st.used_tokens / used)
                st.req_chunk = max(1, min(_cap(st.limits), 2 * used))
            else:
                st.req_chunk = 1
            st.used_requests = st.used_tokens = 0
            fresh = renew and used > 0 and "\x00" not in key_id
            async with st.sync_lock:
                await self._sync_key(key_id, st, now, need=False, renew=fresh)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.sync_s / 2)
            try:
                await self.sync_all()
            except Exception as exc:  # Redis away: keep what is owed, retry next tick
                log.warning("limiter sync failed: %s", exc)

    async def seed_budget(self, key_id: str, bucket: str, used_tokens: int) -> None:
        await self.client.set(f"{self.prefix}{{{key_id}}}:budget:{bucket}", used_tokens, nx=True)

    async def clear(self) -> None:
        """Delete every key under this limiter's prefix (tests)."""
        async for name in self.client.scan_iter(match=self.prefix + "*"):
            await self.client.delete(name)

    async def close(self) -> None:
        """Give everything back (the gateway's `down`), then disconnect."""
        await cancel_and_wait(self._task)
        self._task = None
        with contextlib.suppress(Exception):
            await self.sync_all(renew=False)
        await self.client.aclose()
        await self.client.connection_pool.disconnect()
