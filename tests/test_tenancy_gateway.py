"""Tenancy inside the real gateway against fake engines over 127.0.0.1: keys (401 in
OpenAI's shape), limits (429 + Retry-After + x-ratelimit-*), the usage ledger matching the
engine's token counts, DB routes applied live, and the admin API."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from tenancy_fixtures import NO_POSTGRES, NO_REDIS, POSTGRES_URL, REDIS_URL, reset_postgres
from test_gateway_fakes import FakeEngine, Harness, http

from inferplane.gateway import GatewayConfig, ModelRoute, WeightedRoute, WeightedTarget
from inferplane.gateway.app import build_app
from inferplane.store import Store
from inferplane.tenancy.keys import create_key, revoke_key, rotate_key
from inferplane.tenancy.leased import LeasedRedisLimiter
from inferplane.tenancy.ledger import usage_report
from inferplane.tenancy.routes import set_route
from inferplane.tenancy.service import Tenancy

CHAT = {"model": "llama", "messages": [{"role": "user", "content": "hi"}]}
ADMIN = "admin-secret-token"


class Env:
    def __init__(self, h: Harness, store: Store, tenancy: Tenancy, url: str,
                 v1: FakeEngine, v2: FakeEngine) -> None:  # fmt: skip
        self.h, self.store, self.tenancy, self.url, self.v1, self.v2 = (
            h, store, tenancy, url, v1, v2
        )

    def key(self, name: str, **kw: object) -> str:
        _, secret = self.h.run(create_key(self.store, name, **kw))  # type: ignore[arg-type]
        self.h.run(self.tenancy.refresh())
        return secret

    def post(self, key: str | None, body: dict[str, object] = CHAT) -> object:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return http.post(self.url + "/v1/chat/completions", json=body, headers=headers)


@pytest.fixture(params=["sqlite", "postgres", "sqlite+leased-redis"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    if request.param == "postgres" and not POSTGRES_URL:
        pytest.skip(NO_POSTGRES)
    if request.param.endswith("redis") and not REDIS_URL:
        pytest.skip(NO_REDIS)
    h = Harness()
    url = POSTGRES_URL if request.param == "postgres" else f"sqlite:///{tmp_path / 'db.sqlite'}"
    # Limits in Redis with leased credit (the default with a redis_url): the same tests.
    limiter = (
        LeasedRedisLimiter(REDIS_URL, prefix=f"iptest:{os.urandom(4).hex()}:")
        if request.param.endswith("redis") and REDIS_URL
        else None
    )
    assert url is not None
    if request.param == "postgres":
        h.run(reset_postgres(url))
    store = h.run(Store.open(url))
    v1, v2 = h.engine("llama-v1"), h.engine("llama-v2")
    config = GatewayConfig(
        models=(
            ModelRoute("llama-v1", endpoints=(v1.url,), aliases=("llama",)),
            ModelRoute("llama-v2", endpoints=(v2.url,)),
        ),
        routes=(WeightedRoute("llama", (WeightedTarget("llama-v1", 1),)),),
        access_log=False,
    )
    tenancy = Tenancy(store, limiter, auth="auto", refresh_s=0.05, ledger_flush_s=0.05,
                      admin_token=ADMIN)  # fmt: skip
    app = build_app(config, tenancy)

    gw = h.serve(app)
    yield Env(h, store, tenancy, gw, v1, v2)
    h.close()


def test_auth_is_off_until_a_key_exists_then_401_in_openai_shape(env: Env) -> None:
    assert not env.tenancy.auth_required and "auth: OFF" in env.tenancy.describe()
    assert env.post(None).status_code == 200  # type: ignore[attr-defined]
    secret = env.key("team-a")
    assert env.tenancy.auth_required and "auth: ON" in env.tenancy.describe()
    r = env.post(None)
    assert r.status_code == 401  # type: ignore[attr-defined]
    err = r.json()["error"]  # type: ignore[attr-defined]
    assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error"
    assert env.post("ip-wrong").status_code == 401  # type: ignore[attr-defined]
    assert env.post(secret).status_code == 200  # type: ignore[attr-defined]
    assert "Authorization" not in env.v1.headers[-1]  # the key never reaches the engine


def test_key_lifecycle_revoke_and_rotate(env: Env) -> None:
    secret = env.key("team-a")
    key_id = env.tenancy.authenticate(f"Bearer {secret}".encode()).id  # type: ignore[union-attr]
    _, new = env.h.run(rotate_key(env.store, key_id))
    env.h.run(env.tenancy.refresh())
    assert env.post(secret).status_code == 401  # type: ignore[attr-defined]
    assert env.post(new).status_code == 200  # type: ignore[attr-defined]
    env.h.run(revoke_key(env.store, key_id))
    env.h.run(env.tenancy.refresh())
    assert env.post(new).status_code == 401  # type: ignore[attr-defined]


def test_allowed_models(env: Env) -> None:
    secret = env.key("narrow", models=["llama-v2"])
    r = env.post(secret)
    assert r.status_code == 403  # type: ignore[attr-defined]
    assert env.post(secret, {**CHAT, "model": "llama-v2"}).status_code == 200  # type: ignore[attr-defined]


def test_rpm_429_with_retry_after_and_ratelimit_headers(env: Env) -> None:
    env.tenancy.headers_on_success = True  # gateway.ratelimit_headers: always
    secret = env.key("slow", rpm=3, tpm=100_000)
    first = env.post(secret)
    assert first.status_code == 200  # type: ignore[attr-defined]
    hdr = first.headers  # type: ignore[attr-defined]
    assert hdr["x-ratelimit-limit-requests"] == "3"
    assert hdr["x-ratelimit-remaining-requests"] == "2"
    assert hdr["x-ratelimit-limit-tokens"] == "100000"
    assert hdr["x-ratelimit-reset-requests"].endswith("s")
    assert env.post(secret).status_code == 200  # type: ignore[attr-defined]
    assert env.post(secret).status_code == 200  # type: ignore[attr-defined]
    r = env.post(secret)
    assert r.status_code == 429  # type: ignore[attr-defined]
    assert int(r.headers["retry-after"]) >= 1  # type: ignore[attr-defined]
    assert r.json()["error"]["code"] == "rate_limit_exceeded"  # type: ignore[attr-defined]


def test_ratelimit_headers_on_429_only(env: Env) -> None:
    assert not env.tenancy.headers_on_success  # the default: gateway.ratelimit_headers on_429
    secret = env.key("quiet", rpm=1, tpm=100_000)
    ok = env.post(secret)
    assert ok.status_code == 200  # type: ignore[attr-defined]
    assert not [h for h in ok.headers if h.startswith("x-ratelimit")]  # type: ignore[attr-defined]
    refused = env.post(secret)
    assert refused.status_code == 429  # type: ignore[attr-defined]
    hdr = refused.headers  # type: ignore[attr-defined]
    assert hdr["x-ratelimit-limit-requests"] == "1" and int(hdr["retry-after"]) >= 1


def test_budget_exhaustion(env: Env) -> None:
    secret = env.key("capped", budget_tokens=20, budget_period="day")
    codes = [env.post(secret).status_code for _ in range(4)]  # type: ignore[attr-defined]
    # each request uses 9 tokens (engine usage): 0, 9, 18 < 20 pass, then 27 >= 20 refuses
    assert codes == [200, 200, 200, 429]
    r = env.post(secret)
    assert r.json()["error"]["type"] == "insufficient_quota"  # type: ignore[attr-defined]


LEDGER_REQUESTS = 10_000


async def _mixed_requests(url: str, secret: str, n: int, concurrency: int = 32) -> list[bytes]:
    """n chat requests, a third each: non-streaming, streaming with usage asked for, and
    streaming without (the gateway asks the engine for usage and strips it again)."""
    import aiohttp

    bodies = []
    for i in range(n):
        body: dict[str, object] = {
            "model": "llama",
            "messages": [{"role": "user", "content": "hi " * (i % 23)}],
            "max_tokens": 1 + i % 40,
        }
        if i % 3 == 1:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        elif i % 3 == 2:
            body["stream"] = True
        bodies.append(orjson.dumps(body))
    out: list[bytes] = [b""] * n
    headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
    queue = iter(range(n))

    async def worker(session: aiohttp.ClientSession) -> None:
        for i in queue:
            async with session.post(url + "/v1/chat/completions", data=bodies[i]) as r:
                assert r.status == 200, await r.text()
                out[i] = await r.read()

    async with aiohttp.ClientSession(headers=headers) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return out


def test_ledger_totals_equal_engine_usage(env: Env) -> None:
    """10,000 mixed requests: the ledger holds one row per request and exactly the tokens
    the engine reported, streams included."""
    secret = env.key("metered")
    env.v1.varied_usage = True
    env.v1.chunks = 2  # the stream shape matters here, not its length
    answers = asyncio.run(_mixed_requests(env.url, secret, LEDGER_REQUESTS))
    for i, raw in enumerate(answers):
        if i % 3 == 0:
            assert orjson.loads(raw)["usage"]["completion_tokens"] == 1 + i % 40
        elif i % 3 == 1:
            last = [e for e in raw.split(b"\n\n") if e.startswith(b"data: {")][-1]
            assert orjson.loads(last[6:])["usage"]["completion_tokens"] == 1 + i % 40
        else:  # the client did not ask for usage: it never sees the event
            assert b'"usage"' not in raw and raw.endswith(b"data: [DONE]\n\n")
    ledger = env.tenancy.ledger
    assert ledger is not None
    # A client holds the whole answer a moment before the gateway's handler has recorded it.
    for _ in range(3000):
        if ledger.written + ledger.pending >= LEDGER_REQUESTS:
            break
        env.h.run(asyncio.sleep(0.01))
    env.h.run(ledger.flush())  # waits for a background flush in flight, then writes the rest
    rows = env.h.run(usage_report(env.store, "key"))
    mine = next(r for r in rows if r["name"] == "metered")
    assert mine["requests"] == LEDGER_REQUESTS
    assert mine["errors"] == 0
    assert (mine["prompt_tokens"], mine["completion_tokens"]) == (
        env.v1.reported_prompt_tokens,
        env.v1.reported_completion_tokens,
    )


def test_canary_weights_change_live(env: Env) -> None:
    def split(n: int) -> float:
        before = len(env.v2.requests)
        for _ in range(n):
            assert env.post(None).status_code == 200  # type: ignore[attr-defined]
        return (len(env.v2.requests) - before) / n

    env.h.run(set_route(env.store, "llama", [("llama-v1", 95), ("llama-v2", 5)]))
    env.h.run(env.tenancy.refresh())
    assert abs(split(200) - 0.05) <= 0.02
    env.h.run(set_route(env.store, "llama", [("llama-v1", 50), ("llama-v2", 50)]))
    # the gateway's own refresh loop picks the change up (no restart, no explicit call)
    for _ in range(400):
        if env.tenancy.routes.weighted.get("llama") == (("llama-v1", 50.0), ("llama-v2", 50.0)):
            break
        env.h.run(asyncio.sleep(0.05))
    assert abs(split(200) - 0.5) <= 0.02


def test_per_key_override(env: Env) -> None:
    secret = env.key("beta-tester")
    key_id = env.tenancy.authenticate(f"Bearer {secret}".encode()).id  # type: ignore[union-attr]
    env.h.run(set_route(env.store, "llama", [("llama-v2", 1)], key_id=key_id))
    env.h.run(env.tenancy.refresh())
    before = len(env.v2.requests)
    assert env.post(secret).status_code == 200  # type: ignore[attr-defined]
    assert len(env.v2.requests) == before + 1


def test_admin_api(env: Env) -> None:
    assert http.get(env.url + "/admin/keys").status_code == 401
    auth = {"Authorization": f"Bearer {ADMIN}"}
    r = http.post(env.url + "/admin/keys", json={"name": "via-api", "rpm": 5}, headers=auth)
    assert r.status_code == 201
    secret = r.json()["key"]
    assert secret.startswith("ip-") and r.json()["rpm"] == 5
    assert env.post(secret).status_code == 200  # type: ignore[attr-defined]
    listed = http.get(env.url + "/admin/keys", headers=auth).json()["keys"]
    assert [k["name"] for k in listed] == ["via-api"] and "key" not in listed[0]
    kid = listed[0]["id"]
    r = http.post(env.url + f"/admin/keys/{kid}/revoke", headers=auth)
    assert r.status_code == 200 and r.json()["revoked_at"]
    r = http.put(env.url + "/admin/routes/llama", json={"targets": {"llama-v2": 1}},
                 headers=auth)  # fmt: skip
    assert r.status_code == 200
    assert http.get(env.url + "/admin/routes", headers=auth).json()["routes"] == {
        "llama": [["llama-v2", 1.0]]
    }
    env.h.run(env.tenancy.ledger.flush())  # type: ignore[union-attr]
    usage = http.get(env.url + "/admin/usage?by=model", headers=auth).json()["usage"]
    assert usage and usage[0]["model"] == "llama-v1"
    assert http.post(env.url + "/admin/keys", json={"nope": 1}, headers=auth).status_code == 400
