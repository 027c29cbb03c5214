"""`Tenancy`: what the gateway calls around each request.

    adm = await tenancy.admit(authorization_header, model, prompt_tokens_estimate)
    if isinstance(adm, Rejection): answer adm.status with adm.body() and adm.headers
    ... proxy ...
    tenancy.record(adm, Usage(...), prompt_tokens_estimate)  # or the same plain tuple

Nothing here touches the database on the hot path: keys and routes are cached and
refreshed every `refresh_s`, usage rows go to the batched ledger, limits are in memory or
in one Redis round trip.

Auth: "on" requires a valid key; "off" admits anonymous requests (a valid key is still
honoured for its limits and usage); "auto" (default) is on as soon as the store holds at
least one key (revoking the last key does not open the gateway again); it is
re-evaluated at every refresh.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NamedTuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from inferplane.aio import cancel_and_wait
from inferplane.gateway.config import WeightedRoute, WeightedTarget
from inferplane.gateway.errors import openai_error
from inferplane.gateway.redact import redact_url
from inferplane.gateway.refusals import key_message
from inferplane.gateway.state import GatewayState, WeightedChooser
from inferplane.store import Store
from inferplane.tenancy.keys import KeyPolicy, active_policies, key_count
from inferplane.tenancy.leased import LeasedRedisLimiter
from inferplane.tenancy.ledger import (
    COMPLETION_TOKENS,
    PROMPT_TOKENS,
    TS,
    LedgerRow,
    UsageLedger,
    tokens_since,
)
from inferplane.tenancy.limits import (
    BUDGET,
    REASONS,
    TOO_LARGE,
    KeyState,
    Limiter,
    Limits,
    MemoryLimiter,
    Outcome,
    budget_window,
    period_start,
)
from inferplane.tenancy.routes import RouteTable, Targets, load_routes, seed_routes

log = logging.getLogger("inferplane.tenancy")

AuthMode = Literal["auto", "on", "off"]
RateLimitHeaders = Literal["always", "on_429"]  # when admitted responses carry x-ratelimit-*
AUTH_CACHE_SIZE = 4096  # distinct valid Authorization headers remembered between refreshes


_MILLIS = tuple(b"%dms" % ms for ms in range(1000))  # resets under a second, pre-rendered


def _duration(seconds: float) -> bytes:
    """OpenAI's reset format: '1s', '6m0s', '20ms'."""
    if seconds < 0.9995:
        return _MILLIS[max(0, round(seconds * 1000))]
    s = round(seconds, 3)
    minutes, rest = divmod(s, 60)
    if minutes:
        return b"%dm%ss" % (minutes, f"{rest:g}".encode())
    return f"{rest:g}s".encode()


class Admission(NamedTuple):  # a tuple: one is built per admitted request, cheapest to make
    """An admitted request: who it is, what it reserved, headers for the response."""

    key_id: str | None
    limits: Limits | None = None  # what `lease` holds; None: nothing to release
    batch: bool = False  # the key's priority class is batch
    lease: str = ""  # the request's slot in a shared (Redis) limiter
    headers: Sequence[tuple[bytes, bytes]] = ()
    state: KeyState | None = None  # the key's state in an in-memory limiter


@dataclass(slots=True)
class Rejection:
    status: int
    message: str
    type: str
    code: str
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)

    def body(self) -> bytes:
        return openai_error(self.message, self.type, self.code)


ANONYMOUS = Admission(None)


@dataclass(frozen=True, slots=True)
class _Caller:
    """A valid Authorization header, resolved once per key refresh: what every request with
    it needs, precomputed so admission is a dict hit plus the limiter."""

    policy: KeyPolicy
    key_id: str
    # No expiry and no model list: a cache hit needs no further checks.
    unrestricted: bool
    limits: Limits | None  # effective limits (key's, else the fleet's defaults); None: unlimited
    batch: bool
    # What every request of this key is admitted with when it needs nothing of its own (no
    # lease, no per-request headers, no override): shared, never mutated.
    admission: Admission
    requests_limit: tuple[bytes, bytes] | None  # constant x-ratelimit-limit-* headers
    tokens_limit: tuple[bytes, bytes] | None
    state: KeyState | None  # the key's in-memory limiter state (None: limits are in Redis)


class _Collector(Collector):
    def __init__(self, tenancy: Tenancy) -> None:
        self.t = tenancy

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        t = self.t
        ledger = t.ledger
        yield CounterMetricFamily(
            "inferplane_usage_written", "Usage rows written to the ledger",
            value=ledger.written if ledger else 0,
        )  # fmt: skip
        yield CounterMetricFamily(
            "inferplane_usage_dropped", "Usage rows dropped: buffer full during a DB outage",
            value=ledger.dropped if ledger else 0,
        )  # fmt: skip
        yield CounterMetricFamily(
            "inferplane_usage_rejected", "Usage rows the database refused even cleaned (dropped)",
            value=ledger.rejected if ledger else 0,
        )  # fmt: skip
        yield CounterMetricFamily(
            "inferplane_usage_flush_failures", "Failed ledger flushes (retried)",
            value=ledger.failures if ledger else 0,
        )  # fmt: skip
        yield GaugeMetricFamily(
            "inferplane_usage_buffered", "Usage rows waiting for the next flush",
            value=ledger.pending if ledger else 0,
        )  # fmt: skip
        rejected = CounterMetricFamily(
            "inferplane_tenancy_rejected", "Requests refused by auth or limits", labels=["reason"]
        )
        for reason, n in sorted(t.rejected.items()):
            rejected.add_metric([reason], n)
        yield rejected
        yield CounterMetricFamily(
            "inferplane_limiter_errors", "Limiter backend errors (requests were admitted)",
            value=t.limiter_errors,
        )  # fmt: skip


class Tenancy:
    def __init__(
        self,
        store: Store | None,
        limiter: Limiter | None = None,
        auth: AuthMode = "auto",
        default_limits: Limits | None = None,
        refresh_s: float = 2.0,
        ledger_flush_s: float = 0.25,
        admin_token: str | None = None,
        replica: str | None = None,
        clock: Callable[[], float] = time.time,
        seed: Sequence[tuple[str, Targets]] = (),
        announce: bool = False,
        ratelimit_headers: RateLimitHeaders = "on_429",
        spill_path: Path | None = None,
    ) -> None:
        self.store = store
        self.seed = tuple(seed)  # the fleet file's routes: inserted when the table lacks them
        self.announce = announce
        self.limiter: Limiter = limiter or MemoryLimiter()
        self.auth_mode = auth
        self.default_limits = default_limits or Limits()
        self._no_defaults = self.default_limits.unlimited
        self.refresh_s = refresh_s
        # 429s always carry x-ratelimit-*; admitted responses only with "always" (uvicorn
        # validates every header line: the six cost ~9% RPS on small requests, docs/tenancy.md).
        self.headers_on_success = ratelimit_headers == "always"
        self._admin_token = admin_token
        # generated by `up` when no token is set: in force once auth is, so the console
        # stays reachable after the first `keys create` (and open while auth is off)
        self.generated_admin_token: str | None = None
        self.on_auth_change: Callable[[], None] | None = None  # auth just turned on or off
        self.clock = clock
        self.ledger = (
            UsageLedger(store, ledger_flush_s, spill_path=spill_path) if store is not None else None
        )
        self._add_usage = self.ledger.add if self.ledger is not None else None  # per request
        self.keys: dict[str, KeyPolicy] = {}
        self.keys_ever = 0  # keys created so far, revoked ones included
        self.routes = RouteTable()
        self.state: GatewayState | None = None
        self._lease_prefix = (replica or os.urandom(4).hex()) + ":"
        self._lease_seq = 0
        self._task: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()
        self.rejected: dict[str, int] = {}
        self.limiter_errors = 0
        # Limits in this process's memory: `admit_now` decides without awaiting.
        self._memory_limiter = self.limiter if isinstance(self.limiter, MemoryLimiter) else None
        self.sync_limits = self._memory_limiter is not None
        # Redis with leased credit: admission and release mostly without I/O.
        self._leased = self.limiter if isinstance(self.limiter, LeasedRedisLimiter) else None
        # Valid Authorization header -> resolved key, for the current `keys` dict only.
        self._callers: dict[bytes | None, _Caller] = {}
        self._callers_for: dict[str, KeyPolicy] | None = None

    # ---- lifecycle -------------------------------------------------------------------

    @property
    def admin_token(self) -> str | None:
        if self._admin_token:
            return self._admin_token
        return self.generated_admin_token if self.auth_required else None

    @admin_token.setter
    def admin_token(self, value: str | None) -> None:
        self._admin_token = value

    @property
    def auth_required(self) -> bool:
        if self.auth_mode == "auto":
            return self.keys_ever > 0
        return self.auth_mode == "on"

    def describe(self) -> str:
        """One line for the gateway's startup banner."""
        where = redact_url(self.store.url) if self.store is not None else "no database"
        if self.auth_required:
            return f"auth: ON ({len(self.keys)} active keys in {where})"
        why = "gateway.auth: off" if self.auth_mode == "off" else "no API keys yet"
        return (
            f"auth: OFF ({why}; anyone can call the gateway; create a key with "
            f"`inferplane keys create NAME` to turn it on) — usage ledger: {where}"
        )

    def register_metrics(self, registry: CollectorRegistry) -> None:
        registry.register(_Collector(self))

    async def start(self, state: GatewayState | None = None) -> None:
        self.state = state
        self.routes = RouteTable()  # a refresh before start applied its rules to no state
        if self.store is not None:
            await self.store.migrate()
            if self.seed:
                await seed_routes(self.store, self.seed)
            await self.refresh()
            await self._seed_budgets()
            assert self.ledger is not None
            self.ledger.start()
            self._task = asyncio.get_running_loop().create_task(self._refresh_loop())
        if self.announce:
            print(f"inferplane gateway {self.describe()}", file=sys.stderr, flush=True)

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        if self.ledger is not None:
            await self.ledger.stop()
        await self.limiter.close()

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                await self.refresh()
            except Exception as exc:  # keep serving with the cached keys and routes
                log.warning("tenancy refresh failed: %s", exc)

    async def refresh(self) -> None:
        """Reload keys and routes from the store and apply route changes to the gateway."""
        assert self.store is not None
        was = self.auth_required
        self.keys = await active_policies(self.store, self.clock())
        self.keys_ever = await key_count(self.store)
        self.apply_routes(await load_routes(self.store))
        if self.auth_required != was:
            if self.announce:
                print(f"inferplane gateway {self.describe()}", file=sys.stderr, flush=True)
            if self.on_auth_change is not None:
                self.on_auth_change()

    def apply_routes(self, table: RouteTable) -> None:
        old = self.routes
        state = self.state
        if state is not None:
            for name, targets in table.weighted.items():
                if old.weighted.get(name) == targets:
                    continue
                try:
                    state.set_weights(name, [WeightedTarget(t, w) for t, w in targets])
                except Exception as exc:
                    log.warning("route %s not applied: %s", name, exc)
            for name in old.weighted.keys() - table.weighted.keys():
                state.clear_weights(name)
        if table.per_key != old.per_key and state is not None:
            # Per-key overrides resolve in the gateway's state, with every other name.
            per_key: dict[str, dict[str, WeightedChooser]] = {}
            for key_id, routes in table.per_key.items():
                choosers = per_key[key_id] = {}
                for name, targets in routes.items():
                    try:
                        wr = WeightedRoute(name, tuple(WeightedTarget(t, w) for t, w in targets))
                    except Exception as exc:
                        log.warning("override %s for %s not applied: %s", name, key_id, exc)
                        continue
                    choosers[name] = WeightedChooser(wr.targets)
            state.set_key_routes(per_key)
        self.routes = table

    async def _seed_budgets(self) -> None:
        assert self.store is not None
        now = self.clock()
        for period in ("day", "month", "total"):
            policies = [
                p for p in self.keys.values()
                if p.limits.budget_tokens and p.limits.budget_period == period
            ]  # fmt: skip
            if not policies:
                continue
            bucket, _ = budget_window(period, now)
            start = period_start(period, now)
            used = await tokens_since(self.store, start)
            for p in policies:
                await self.limiter.seed_budget(p.id, bucket, used.get(p.id, 0))

    # ---- the hot path ------------------------------------------------------------------

    def _reject(self, status: int, reason: str, message: str, type_: str, code: str,
                headers: list[tuple[bytes, bytes]] | None = None) -> Rejection:  # fmt: skip
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        return Rejection(status, message, type_, code, headers or [])

    def authenticate(self, authorization: bytes | None) -> KeyPolicy | None:
        caller = self._caller(authorization)
        return caller.policy if caller is not None else None

    def _caller(self, authorization: bytes | None) -> _Caller | None:
        """The resolved key for an Authorization header, or None. Hits come from a cache of
        valid headers for the current `keys` dict (a refresh that replaces it, e.g. after a
        revocation, empties the cache); misses hash the secret."""
        if not authorization:
            return None
        if self._callers_for is not self.keys:
            self._callers = {}
            self._callers_for = self.keys
        caller = self._callers.get(authorization)
        if caller is not None:
            return caller
        scheme, _, token = authorization.partition(b" ")
        if scheme.lower() != b"bearer" or not token:
            return None
        policy = self.keys.get(hashlib.sha256(token.strip()).hexdigest())
        if policy is None:
            return None
        limits = policy.limits if self._no_defaults else self._effective(policy.limits)
        batch = policy.priority == "batch"
        memory = self._memory_limiter
        state = memory.state(policy.id) if memory is not None else None
        effective = None if limits.unlimited else limits
        caller = _Caller(
            policy,
            policy.id,
            policy.expires_at is None and policy.allowed_models is None,
            effective,
            batch,
            Admission(policy.id, effective, batch, state=state),
            (b"x-ratelimit-limit-requests", b"%d" % limits.rpm) if limits.rpm else None,
            (b"x-ratelimit-limit-tokens", b"%d" % limits.tpm) if limits.tpm else None,
            state,
        )
        if len(self._callers) >= AUTH_CACHE_SIZE:
            self._callers.clear()
        self._callers[authorization] = caller
        return caller

    def admit_now(
        self, authorization: bytes | None, model: str, est_tokens: int, output_tokens: int = 0
    ) -> Admission | Rejection:
        """The whole admission decision without awaiting: valid when `sync_limits` (limits in
        this process's memory). Kept flat on purpose: it runs on every request, and inside
        the gateway every call and object costs several times what a micro-benchmark shows
        (docs/tenancy.md, "Cost on the hot path")."""
        now = self.clock()
        # The common case inline: a cached key without expiry or model list.
        caller = self._callers.get(authorization) if self._callers_for is self.keys else None
        if caller is None or not caller.unrestricted:
            found = self._identify(authorization, model, now)
            if not isinstance(found, _Caller):
                return found  # anonymous, 401 or 403
            caller = found
        limits = caller.limits
        if limits is not None:
            # With `sync_limits` (in memory) every cached key holds its limiter state.
            state: KeyState = caller.state  # type: ignore[assignment]
            refused = state.acquire(limits, est_tokens, now, output_tokens)
            if refused is not None:
                return self._limit_rejection(caller.key_id, limits, refused)
            if self.headers_on_success:
                headers = self._headers(caller, state.report(limits, now))
                return Admission(caller.key_id, limits, caller.batch, "", headers, state)
        return caller.admission

    async def admit(
        self, authorization: bytes | None, model: str, est_tokens: int, output_tokens: int = 0
    ) -> Admission | Rejection:
        """Admission for any limiter (Redis: one round trip). `est_tokens` is what the
        request reserves: its prompt estimate plus `output_tokens`, the most it may generate
        (n × max_tokens); `record` settles it with the engine's usage."""
        if self.sync_limits:
            return self.admit_now(authorization, model, est_tokens, output_tokens)
        now = self.clock()
        caller = self._identify(authorization, model, now)
        if not isinstance(caller, _Caller):
            return caller
        key_id = caller.key_id
        limits = caller.limits
        if limits is None:
            return caller.admission
        leased = self._leased
        out = (
            leased.try_acquire(key_id, limits, est_tokens, now, output_tokens)
            if leased is not None
            else None
        )
        if out is not None:  # from this gateway's leased credit, no round trip
            if self.headers_on_success:
                return Admission(key_id, limits, caller.batch, "", self._headers(caller, out))
            return Admission(key_id, limits, caller.batch)
        self._lease_seq += 1
        lease = self._lease_prefix + str(self._lease_seq)  # unique across gateway replicas
        try:
            out = await self.limiter.acquire(
                key_id, lease, limits, est_tokens, now, output_tokens
            )
        except Exception as exc:  # a limiter outage must not take the gateway down
            self.limiter_errors += 1
            log.warning("limiter unavailable, admitting without limits: %s", exc)
            return caller.admission._replace(limits=None)
        if out.code:
            return self._limit_rejection(key_id, limits, out)
        headers = self._headers(caller, out) if self.headers_on_success else ()
        return Admission(key_id, limits, caller.batch, lease, headers)

    def _identify(
        self, authorization: bytes | None, model: str, now: float
    ) -> _Caller | Admission | Rejection:
        """Who is calling and may they use `model`: the key (its limits still to be
        acquired), ANONYMOUS when auth is off and no valid key was sent, or the 401/403."""
        caller = self._caller(authorization)
        if caller is None:
            if not self.auth_required:
                return ANONYMOUS
            return self._reject(401, "auth", key_message(authorization),
                                "invalid_request_error", "invalid_api_key")
        policy = caller.policy
        if policy.expires_at is not None and policy.expires_at <= now:
            return self._reject(
                401, "expired", f"API key {policy.id} has expired.", "invalid_request_error",
                "invalid_api_key",
            )  # fmt: skip
        if policy.allowed_models is not None and model not in policy.allowed_models:
            return self._reject(
                403, "model", f"API key {policy.id} may not use model `{model}`.",
                "invalid_request_error", "model_not_allowed",
            )  # fmt: skip
        return caller

    def _effective(self, own: Limits) -> Limits:
        if self._no_defaults:
            return own
        d = self.default_limits
        return Limits(
            own.rpm or d.rpm,
            own.tpm or d.tpm,
            own.max_concurrent or d.max_concurrent,
            own.budget_tokens or d.budget_tokens,
            own.budget_period if own.budget_tokens else d.budget_period,
        )

    @staticmethod
    def _headers(caller: _Caller, out: Outcome) -> list[tuple[bytes, bytes]]:
        """OpenAI's x-ratelimit-* response headers for the limits the key has."""
        requests, tokens = caller.requests_limit, caller.tokens_limit
        headers: list[tuple[bytes, bytes]] = []
        if requests is not None:
            headers += (
                requests,
                (b"x-ratelimit-remaining-requests", b"%d" % out.requests_remaining),
                (b"x-ratelimit-reset-requests", _duration(out.requests_reset_s)),
            )
        if tokens is not None:
            headers += (
                tokens,
                (b"x-ratelimit-remaining-tokens", b"%d" % out.tokens_remaining),
                (b"x-ratelimit-reset-tokens", _duration(out.tokens_reset_s)),
            )
        return headers

    def _limit_rejection(self, key_id: str, limits: Limits, out: Outcome) -> Rejection:
        reason = REASONS[out.code]
        retry = max(1, int(out.retry_after_s + 0.999))
        headers = [(b"retry-after", b"%d" % retry), (b"retry-after-ms", b"%d" % (
            max(1, round(out.retry_after_s * 1000))))]  # fmt: skip
        if limits.rpm:
            headers.append((b"x-ratelimit-limit-requests", b"%d" % limits.rpm))
        if limits.tpm:
            headers.append((b"x-ratelimit-limit-tokens", b"%d" % limits.tpm))
        if out.code == BUDGET:
            return self._reject(
                429, "budget",
                f"API key {key_id} has used its token budget of {limits.budget_tokens} "
                f"for this {limits.budget_period}, or this request's most output (n × "
                "max_tokens) does not fit in what is left.",
                "insufficient_quota", "insufficient_quota", headers,
            )  # fmt: skip
        if out.code == TOO_LARGE:
            return self._reject(
                429, "too_large",
                f"Request too large: its estimated prompt plus its most output (n × "
                f"max_tokens) exceed the key's limit of {limits.tpm} tokens per minute.",
                "tokens", "rate_limit_exceeded", headers,
            )  # fmt: skip
        return self._reject(
            429, reason.replace(" ", "_"),
            f"Rate limit reached for {reason} on API key {key_id}. "
            f"Please try again in {out.retry_after_s:.3g}s.",
            "requests" if reason != "tokens per minute" else "tokens",
            "rate_limit_exceeded", headers,
        )  # fmt: skip

    def record(self, adm: Admission, row: LedgerRow, est_tokens: int) -> None:
        """After the response: free the concurrency slot, correct the admission's token
        estimate `est_tokens` with the engine's usage, and queue the ledger row (a `Usage`
        or the same plain tuple). Never blocks."""
        limits = adm.limits
        if limits is not None:
            delta = row[PROMPT_TOKENS] + row[COMPLETION_TOKENS] - est_tokens
            state = adm.state
            if state is not None:  # in memory
                state.release(limits, delta, row[TS])
            elif self._leased is not None:  # settled at the next sync
                self._leased.release_now(adm.key_id or "", limits, delta, row[TS])
            else:
                task = asyncio.get_running_loop().create_task(
                    self._release(adm, limits, delta, row[TS])
                )
                self._pending.add(task)
                task.add_done_callback(self._pending.discard)
        if self._add_usage is not None:
            self._add_usage(row)

    async def _release(self, adm: Admission, limits: Limits, delta: int, now: float) -> None:
        try:
            await self.limiter.release(adm.key_id or "", str(adm.lease), limits, delta, now)
        except Exception as exc:  # the lease expires on its own (lease_ttl_s)
            self.limiter_errors += 1
            log.warning("limiter release failed: %s", exc)
