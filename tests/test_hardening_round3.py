"""Issue 30 (security and faults, round 3), each attack reproduced against the real gateway
and fake engines over 127.0.0.1: poisoned model names, response takeover, `background`
spellings, budget and TPM overruns, a request's own deadline ejecting replicas, the
replica header. Ledger-level cases live in tests/test_tenancy_ledger.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tenancy_fixtures import NO_POSTGRES, POSTGRES_URL, reset_postgres
from test_gateway_failures import metric, wait_until
from test_gateway_fakes import FakeEngine, Harness, http

from inferplane.gateway import GatewayConfig, ModelRoute
from inferplane.gateway.app import GatewayApp, build_app
from inferplane.store import Store
from inferplane.tenancy.ledger import usage_report
from inferplane.tenancy.service import Tenancy

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class Env:
    def __init__(self, h: Harness, store: Store, tenancy: Tenancy, app: GatewayApp,
                 url: str, engine: FakeEngine) -> None:  # fmt: skip
        self.h, self.store, self.tenancy, self.app, self.url, self.engine = (
            h, store, tenancy, app, url, engine
        )

    def post(self, body: object, path: str = "/v1/chat/completions",
             key: str | None = None) -> object:  # fmt: skip
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return http.post(self.url + path, json=body, headers=headers)

    def rows(self) -> int:
        return sum(r["requests"] for r in self.h.run(usage_report(self.store, "model")))


@pytest.fixture(params=["sqlite", "postgres"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    if request.param == "postgres" and not POSTGRES_URL:
        pytest.skip(NO_POSTGRES)
    h = Harness()
    url = POSTGRES_URL if request.param == "postgres" else f"sqlite:///{tmp_path / 'db.sqlite'}"
    assert url is not None
    if request.param == "postgres":
        h.run(reset_postgres(url))
    store = h.run(Store.open(url))
    engine = h.engine("m")
    config = GatewayConfig(models=(ModelRoute("m", endpoints=(engine.url,)),), access_log=False)
    tenancy = Tenancy(store, auth="auto", refresh_s=0.05, ledger_flush_s=0.05)
    app = build_app(config, tenancy)
    gw = h.serve(app)
    yield Env(h, store, tenancy, app, gw, engine)

    async def stop() -> None:  # the gateway (its tenancy, the ledger), then the store
        for server, task in h._servers:
            server.should_exit = server.force_exit = True
            await task
            await server.lifespan.shutdown()
        h._servers.clear()
        await store.close()

    h.run(stop())
    h.close()


# ---- item 1 and 2, issue 28 item 5: model names --------------------------------------


def test_poisoned_model_names_never_stop_the_ledger(env: Env) -> None:
    """A NUL or an over-long unknown name once left a row PostgreSQL refused, and every
    later flush failed with it: usage was buffered forever and lost at `down`."""
    for name in ("nul\u0000", "n" * 300, "line\nbreak"):
        r = env.post({**CHAT, "model": name})
        assert r.status_code == 400, r.text  # type: ignore[attr-defined]
        assert r.json()["error"]["param"] == "model"  # type: ignore[attr-defined]
    for _ in range(3):
        assert env.post(CHAT).status_code == 200  # type: ignore[attr-defined]
    wait_until(lambda: env.rows() == 3)
    assert env.tenancy.ledger is not None and env.tenancy.ledger.failures == 0


def test_unknown_model_names_are_one_bucket_in_usage_and_metrics(env: Env) -> None:
    """Typos (or an attacker's 4 MB names) once became models in usage, on the console's
    usage page and in metrics labels: now one bucket, nothing of the name stored."""
    for i in range(5):
        r = env.post({**CHAT, "model": f"typo-{i}"})
        assert r.status_code == 404  # type: ignore[attr-defined]
    assert env.post(CHAT).status_code == 200  # type: ignore[attr-defined]
    wait_until(lambda: env.rows() == 6)
    by_model = {r["model"]: r["requests"] for r in env.h.run(usage_report(env.store, "model"))}
    assert by_model == {"-": 5, "m": 1}
    text = http.get(env.url + "/metrics").text
    assert "typo-" not in text


def test_a_4mb_model_name_is_refused_before_anything_is_written(env: Env) -> None:
    r = env.post({**CHAT, "model": "x" * (4 << 20)})
    assert r.status_code in (400, 413)  # type: ignore[attr-defined]
    assert env.post(CHAT).status_code == 200  # type: ignore[attr-defined]
    wait_until(lambda: env.rows() == 1)
    assert "xxxx" not in http.get(env.url + "/metrics").text


# ---- item 3: response takeover through a client-set request_id ------------------------


def test_another_key_cannot_take_over_a_stored_response(tmp_path: Path) -> None:
    """vLLM uses a client-set `request_id` as the response id: key B once sent A's id,
    then read A's instructions, locked A out (404) and continued A's conversation."""
    from test_gateway_endpoints import _keyed

    keyed = _keyed(tmp_path)
    try:
        alice, bob = keyed.key("alice"), keyed.key("bob")
        made = keyed.post("/v1/responses", {"model": "chat", "input": "secret plan",
                                            "instructions": "alice's instructions",
                                            "request_id": "mine", "max_output_tokens": 4},
                          alice).json()  # fmt: skip
        rid = made["id"]
        stolen = keyed.post("/v1/responses", {"model": "chat", "input": "mine now",
                                              "request_id": rid, "max_output_tokens": 4},
                            bob)  # fmt: skip
        assert stolen.status_code == 200 and stolen.json()["id"] != rid
        assert keyed.get(f"/v1/responses/{rid}", bob).status_code == 404
        mine = keyed.get(f"/v1/responses/{rid}", alice)
        assert mine.status_code == 200 and mine.json()["instructions"] == "alice's instructions"
        follow = keyed.post("/v1/responses", {"model": "chat", "input": "and then?",
                                              "previous_response_id": rid}, bob)  # fmt: skip
        assert follow.status_code == 404
    finally:
        keyed.fleet.close()


def test_response_ids_are_never_re_owned_and_bounded_per_key() -> None:
    """Item 13: 10,001 responses of one key once evicted every other key's ids."""
    from inferplane.gateway.routes import ResponseOwners

    owners = ResponseOwners(limit=100, per_key=10)
    assert owners.learn(b'{"id":"resp_a"}', "m", "u1", "alice") == "resp_a"
    assert owners.learn(b'{"id":"resp_a"}', "m", "u2", "bob") is None  # not re-owned
    owner = owners.get("resp_a")
    assert owner is not None and owner.key_id == "alice" and owner.url == "u1"
    for i in range(1000):
        owners.learn(b'{"id":"resp_b%d"}' % i, "m", "u", "bob")
    assert owners.get("resp_a") is not None  # bob's flood evicts only bob's own ids
    assert owners.get("resp_b999") is not None and owners.get("resp_b0") is None
    assert len(owners) == 11
    busy = ResponseOwners(limit=12, per_key=10)
    busy.learn(b'{"id":"resp_a"}', "m", "u", "alice")
    for key in ("bob", "carol"):
        for i in range(10):
            busy.learn(b'{"id":"resp_%s%d"}' % (key.encode(), i), "m", "u", key)
    assert len(busy) == 12 and busy.get("resp_a") is not None  # the biggest keys give way


def test_store_false_responses_are_not_remembered() -> None:
    from inferplane.gateway.responses_guard import stores_response

    assert stores_response({}) and stores_response({"store": True})
    for value in (False, "false", 0, "no"):
        assert not stores_response({"store": value})


# ---- item 4: `background` spelled as vLLM's pydantic reads it ------------------------


@pytest.mark.parametrize("value", [True, "true", 1, "yes", "on", "T", 1.0])
def test_background_is_refused_however_it_is_spelled(env: Env, value: object) -> None:
    r = env.post({"model": "m", "input": "x", "background": value}, "/v1/responses")
    assert r.status_code == 400  # type: ignore[attr-defined]
    assert r.json()["error"]["param"] == "background"  # type: ignore[attr-defined]
    assert env.engine.requests == []  # never forwarded


def test_background_false_and_odd_values() -> None:
    from inferplane.gateway.errors import ClientError
    from inferplane.gateway.responses_guard import guard_responses_body

    for value in (False, "false", 0, "no", None):
        assert guard_responses_body({"background": value}, None) is False
    with pytest.raises(ClientError, match="must be a boolean"):
        guard_responses_body({"background": "maybe"}, None)
    data = {"request_id": "abc"}
    assert guard_responses_body(data, "k1") and data["request_id"].endswith("-abc")
    other = {"request_id": "abc"}
    guard_responses_body(other, "k2")
    assert other["request_id"] != data["request_id"]


# ---- item 5: budgets and TPM reserve the output ---------------------------------------


def _concurrent(n: int, call: object) -> list[int]:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(n) as pool:
        return [r.status_code for r in pool.map(lambda _: call(), range(n))]  # type: ignore[operator]


def test_concurrent_requests_cannot_overrun_a_budget(env: Env) -> None:
    from inferplane.tenancy.keys import create_key

    _, secret = env.h.run(create_key(env.store, "capped", budget_tokens=2000,
                                     budget_period="day"))  # fmt: skip
    env.h.run(env.tenancy.refresh())
    env.engine.varied_usage = True  # completion tokens = max_tokens, as a long answer does
    env.engine.delay_s = 0.5  # all 20 in flight at once
    body = {**CHAT, "max_tokens": 300}
    codes = _concurrent(20, lambda: env.post(body, key=secret))
    served = env.engine.reported_prompt_tokens + env.engine.reported_completion_tokens
    assert codes.count(200) >= 5 and 429 in codes
    assert served <= 2000  # once 20 × 315 = 6,300 (3.2×)


def test_n_times_max_tokens_counts_against_tpm(env: Env) -> None:
    from inferplane.tenancy.keys import create_key

    _, secret = env.h.run(create_key(env.store, "tpm", tpm=2000))
    env.h.run(env.tenancy.refresh())
    big = env.post({**CHAT, "n": 8, "max_tokens": 300}, key=secret)
    assert big.status_code == 429  # type: ignore[attr-defined]
    assert big.json()["error"]["code"] == "rate_limit_exceeded"  # type: ignore[attr-defined]
    assert env.engine.requests == []
    assert env.post({**CHAT, "max_tokens": 300}, key=secret).status_code == 200  # type: ignore[attr-defined]


def test_output_reservation() -> None:
    from inferplane.gateway.reserve import output_reservation

    chat = "/v1/chat/completions"
    assert output_reservation({"max_tokens": 300, "n": 8}, chat, None) == 2400
    assert output_reservation({"max_tokens": 300}, chat, 64) == 64
    assert output_reservation({}, chat, 64) == 64 and output_reservation({}, chat, None) == 0
    assert output_reservation({"max_output_tokens": 50}, "/v1/responses", None) == 50
    assert output_reservation({"max_tokens": 9}, "/v1/embeddings", None) == 0
    assert output_reservation({"max_tokens": 10, "best_of": 3, "n": 2}, "/v1/completions",
                              None) == 30  # fmt: skip


# ---- item 6: a request's own deadline is not the replica's failure --------------------


def _timed(h: Harness, engine: FakeEngine, total_s: float) -> tuple[GatewayApp, str]:
    from inferplane.gateway import Timeouts

    route = ModelRoute("m", endpoints=(engine.url,),
                       timeouts=Timeouts(first_token_s=30, idle_s=30, total_s=total_s))
    app = build_app(GatewayConfig(models=(route,), access_log=False, health_interval_s=60))
    return app, h.serve(app)


def test_long_requests_reaching_total_s_do_not_eject_a_healthy_replica() -> None:
    h = Harness()
    try:
        engine = h.engine("m")
        engine.delay_s = 2.0  # a long generation, healthy engine
        app, url = _timed(h, engine, total_s=0.5)
        for _ in range(4):
            assert http.post(url + "/v1/chat/completions", json=CHAT).status_code == 504
        h.run(__import__("asyncio").sleep(0.5))  # the background /health checks
        (backend,) = app.state.backends("m")
        assert not backend.ejected and backend.consecutive_failures == 0
        assert metric(url, "inferplane_replica_ejections_total") == 0
        engine.delay_s = 0
        assert http.post(url + "/v1/chat/completions", json=CHAT).status_code == 200
    finally:
        h.close()


def test_a_hung_replica_reaching_total_s_is_still_ejected() -> None:
    h = Harness()
    try:
        engine = h.engine("m")
        engine.hang = True
        engine.health_status = 503  # and its /health fails: the replica's fault
        app, url = _timed(h, engine, total_s=0.3)
        for _ in range(3):
            assert http.post(url + "/v1/chat/completions", json=CHAT).status_code == 504
        wait_until(lambda: app.state.backends("m")[0].ejected)
    finally:
        h.close()


# ---- item 7: DNS rebinding against the open console ------------------------------------


def test_the_open_console_refuses_a_foreign_host_or_origin() -> None:
    import asyncio

    import httpx

    from inferplane.console import attach

    async def main() -> dict[str, int]:
        config = GatewayConfig(models=(ModelRoute("m"),), console_allowed_hosts=("gpu-box",))
        app = build_app(config)
        console = attach(app, None, "INFERPLANE_TEST_NO_SUCH_TOKEN")
        transport = httpx.ASGITransport(app=app)
        out = {}
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            restart = "/ui/api/instances/chat-0/restart"
            act = {"x-inferplane-console": "1"}
            evil = "rebind.attacker.example"
            out["rebound"] = (await c.post(restart, headers={
                **act, "Host": evil, "Origin": f"http://{evil}"})).status_code
            out["rebound_get"] = (await c.get("/ui/api/fleet", headers={"Host": evil})).status_code
            out["foreign_origin"] = (await c.post(restart, headers={
                **act, "Origin": f"http://{evil}"})).status_code
            out["loopback"] = (await c.get("/ui/api/fleet",
                                           headers={"Host": "127.0.0.1:8000"})).status_code
            out["localhost"] = (await c.get("/ui/api/fleet",
                                            headers={"Host": "localhost:8000"})).status_code
            out["v6"] = (await c.get("/ui/api/fleet", headers={"Host": "[::1]:8000"})).status_code
            listed = await c.get("/ui/api/fleet", headers={"Host": "GPU-box:8000"})
            out["listed"] = listed.status_code
        await console.stop()
        return out

    out = asyncio.run(main())
    assert out == {"rebound": 403, "rebound_get": 403, "foreign_origin": 403,
                   "loopback": 200, "localhost": 200, "v6": 200, "listed": 200}  # fmt: skip


# ---- item 17, issue 28 item 19: engine addresses stay internal -------------------------


def test_replica_header_is_opt_in_and_errors_name_no_engine_address() -> None:
    import socket

    h = Harness()
    try:
        engine = h.engine("m")
        _, url = h.gateway(GatewayConfig(models=(ModelRoute("m", endpoints=(engine.url,)),),
                                         access_log=False))  # fmt: skip
        assert "x-inferplane-replica" not in http.post(url + "/v1/chat/completions",
                                                       json=CHAT).headers  # fmt: skip
        config = GatewayConfig(models=(ModelRoute("m", endpoints=(engine.url,)),),
                               access_log=False, expose_replica_header=True)  # fmt: skip
        _, exposed = h.gateway(config)
        r = http.post(exposed + "/v1/chat/completions", json=CHAT)
        assert r.headers["x-inferplane-replica"] == "m-endpoint-0"  # a name, not its URL
        with socket.socket() as s:  # a port nothing listens on
            s.bind(("127.0.0.1", 0))
            dead = f"http://127.0.0.1:{s.getsockname()[1]}"
        _, broken = h.gateway(GatewayConfig(models=(ModelRoute("m", endpoints=(dead,)),),
                                            access_log=False))  # fmt: skip
        failed = http.post(broken + "/v1/chat/completions", json=CHAT)
        assert failed.status_code == 502
        assert "127.0.0.1" not in failed.text and dead not in failed.text
        assert "m-endpoint-0" in failed.json()["error"]["message"]
    finally:
        h.close()


# ---- item 9: console sessions expire, end at sign-out, and sign-in is throttled ----------


def test_console_sessions_expire_and_end_at_sign_out() -> None:
    import asyncio

    import httpx

    from inferplane.console import attach
    from inferplane.console.auth import COOKIE, LoginThrottle, Sessions

    async def main() -> dict[str, int]:
        app = build_app(GatewayConfig(models=(ModelRoute("m"),)))
        app.tenancy = Tenancy(None, auth="on", admin_token="s3cret")
        console = attach(app, None, "INFERPLANE_ADMIN_TOKEN")
        transport = httpx.ASGITransport(app=app)
        out = {}
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            signed = await c.post("/ui/login", data={"token": "s3cret"})
            cookie = signed.headers["set-cookie"]
            assert "Max-Age=43200" in cookie
            value = cookie.partition("=")[2].partition(";")[0]
            c.cookies.set(COOKIE, value)
            out["signed_in"] = (await c.get("/ui/api/fleet")).status_code
            await c.post("/ui/logout")
            c.cookies.set(COOKIE, value)  # the old cookie, replayed after sign-out
            out["after_logout"] = (await c.get("/ui/api/fleet")).status_code
            guesses = [(await c.post("/ui/login", data={"token": f"guess{i}"})).status_code
                       for i in range(8)]  # fmt: skip
            out["guesses_refused"] = guesses.count(401)
            out["guesses_throttled"] = guesses.count(429)
        await console.stop()
        return out

    out = asyncio.run(main())
    assert out == {"signed_in": 200, "after_logout": 401, "guesses_refused": 5,
                   "guesses_throttled": 3}  # fmt: skip
    sessions = Sessions(ttl_s=60)
    value = sessions.issue("s3cret", now=1000.0)
    assert sessions.valid("s3cret", value, now=1059.0)
    assert not sessions.valid("s3cret", value, now=1061.0)  # expired
    assert not sessions.valid("rotated", value, now=1001.0)  # the token changed
    throttle = LoginThrottle(per_client=2, overall=3, window_s=10)
    for client in ("a", "a", "b"):
        throttle.failed(client, now=0.0)
    assert throttle.retry_after("a", now=1.0) == 9.0  # per client
    assert throttle.retry_after("c", now=1.0) == 9.0  # overall
    assert throttle.retry_after("c", now=10.5) == 0.0


# ---- item 10 (and 14's streams): a hung replica is found by its /health ----------------


def test_a_hung_endpoint_replica_is_ejected_with_default_timeouts() -> None:
    """With the default timeouts (600 s to the first byte, 3,600 s in all) a hung replica
    once held every request sent to it: 6 of 12 hung >= 10 s, 0 ejections."""
    import threading

    h = Harness()
    try:
        hung, healthy = h.engine("m"), h.engine("m")
        route = ModelRoute("m", endpoints=(hung.url, healthy.url))
        app = build_app(GatewayConfig(models=(route,), access_log=False, health_interval_s=0.2))
        url = h.serve(app)
        hung.hang = hung.health_hang = True  # SIGSTOPped: nothing answers, not even /health
        results: list[int] = []

        def call() -> None:
            results.append(http.post(url + "/v1/chat/completions", json=CHAT).status_code)

        threads = [threading.Thread(target=call) for _ in range(6)]
        for t in threads:
            t.start()
        wait_until(lambda: next(b for b in app.state.backends("m") if b.url == hung.url).ejected,
                   timeout=15)  # fmt: skip
        for t in threads:
            t.join(15)
        assert len(results) == 6 and 200 in results  # those on the hung one ended at once
        assert all(code in (200, 502) for code in results), results
        assert all(http.post(url + "/v1/chat/completions", json=CHAT).status_code == 200
                   for _ in range(6))  # fmt: skip
    finally:
        h.close()
