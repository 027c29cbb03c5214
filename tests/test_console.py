"""The web console's server side, without a browser: its JSON and HTML endpoints through
the gateway's ASGI app, the sampler against a fake engine, the usage view on a real
SQLite ledger, the auth rule, and the files it serves (no CDN anywhere)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from console_fleet import console_fleet
from test_gateway_fakes import Harness, harness, http  # noqa: F401

from inferplane.console import ConsoleApp, attach, pages
from inferplane.console import series as S
from inferplane.console.app import STATIC
from inferplane.console.auth import COOKIE
from inferplane.console.usage import usage_view
from inferplane.console.views import card_shares, fleet_view, models_view
from inferplane.gateway import Backend, GatewayConfig, ModelRoute, WeightedRoute, WeightedTarget
from inferplane.gateway.app import GatewayApp, build_app
from inferplane.gateway.fleet import gateway_config_from_fleet
from inferplane.planner.build import plan_fleet
from inferplane.planner.plan import Plan
from inferplane.runtime.state import StateDir
from inferplane.spec import load_fleet
from inferplane.store import Store
from inferplane.tenancy.keys import create_key
from inferplane.tenancy.service import Tenancy

REPO = Path(__file__).parent.parent
FLEET = console_fleet("embed", extra="""\
routes:
  - model: chat
    backends: [{target: chat, weight: 9}, {target: embed, weight: 1}]
""")


@dataclass
class FakeSource:
    """What the console reads from a Runtime: its plan, state directory and status."""

    plan: Plan | None
    state_dir: StateDir
    instances: list[dict[str, Any]] = field(default_factory=list)

    def status(self) -> dict[str, Any]:
        return {"instances": self.instances, "started_at": time.time() - 3600}


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Plan]:
    path = tmp_path_factory.mktemp("console") / "fleet.yaml"
    path.write_text(FLEET)
    spec = load_fleet(path)
    return spec, plan_fleet(spec, fleet_file=str(path))


def _instances(plan: Plan, **states: str) -> list[dict[str, Any]]:
    return [
        {"name": i.id, "model": i.model, "url": f"http://127.0.0.1:{9 + n}", "pid": 100 + n,
         "port": 9 + n, "gpus": i.gpu_indices, "state": states.get(i.id, "ready"),
         "restarts": 0, "last_error": None}
        for n, i in enumerate(plan.instances)
    ]  # fmt: skip


@pytest.fixture()
async def console(
    planned: tuple[Any, Plan], tmp_path: Path
) -> AsyncIterator[tuple[GatewayApp, FakeSource]]:
    spec, plan = planned
    app = build_app(gateway_config_from_fleet(spec, plan))
    source = FakeSource(plan, StateDir(tmp_path / "state"), _instances(plan))
    for inst in source.instances:
        app.state.set_backends(inst["model"], [*app.state.backends(inst["model"]),
                                               Backend(inst["url"])])  # fmt: skip
    attach(app, source, "INFERPLANE_ADMIN_TOKEN")
    yield app, source
    assert app.console is not None
    await app.console.stop()


def _client(app: GatewayApp) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")


# ---- the fleet map ----------------------------------------------------------------------


def test_card_shares_add_up_to_the_plans_used_memory(planned: tuple[Any, Plan]) -> None:
    _, plan = planned
    for gpu in plan.gpus:
        shares = card_shares(plan, gpu)
        assert [s["id"] for s in shares] == gpu.instances
        for s in shares:
            parts = s["weights_gib"] + s["kv_cache_gib"] + s["overhead_gib"]
            assert parts == pytest.approx(s["share_gib"], abs=0.002)
            assert s["overhead_gib"] > 0  # activations, graphs, non-torch, CUDA context
        assert sum(s["share_gib"] for s in shares) == pytest.approx(gpu.used_gib, abs=0.02)
    assert any(len(g.instances) == 2 for g in plan.gpus)  # the embedder shares a card


async def test_fleet_api_places_every_instance_and_says_when_there_is_no_live_data(
    console: tuple[GatewayApp, FakeSource],
) -> None:
    app, source = console
    assert source.plan is not None
    async with _client(app) as c:
        body = (await c.get("/ui/api/fleet")).json()
        html = (await c.get("/ui/partials/fleet")).text
    [node] = body["nodes"]
    placed = {s["id"]: g["index"] for g in node["gpus"] for s in g["instances"]}
    assert placed == {i.id: i.gpu_indices[0] for i in source.plan.instances}
    assert all(s["live"] is None and s["state"] == "ready"
               for g in node["gpus"] for s in g["instances"])  # fmt: skip
    assert html.count("no live data") == len(source.plan.instances)
    for gpu in source.plan.gpus:  # the free segment is the plan's free memory
        assert f'data-gpu-index="{gpu.index}" data-memory-gib="{gpu.memory_gib:.3f}"' in html
        assert f'data-kind="free" data-gib="{gpu.free_gib:.3f}"' in html


def test_fleet_view_without_a_plan_or_a_runtime(tmp_path: Path) -> None:
    bare = fleet_view(None, None)
    assert bare["nodes"] == [] and "without `inferplane up`" in bare["message"]
    source = FakeSource(None, StateDir(tmp_path), [
        {"name": "chat-0", "model": "chat", "url": "u", "state": "starting", "restarts": 2},
    ])  # fmt: skip
    view = fleet_view(source, None)
    assert "lists no GPUs" in view["message"]
    assert view["unplaced"] == [{"id": "chat-0", "model": "chat", "state": "loading",
                                 "restarts": 2, "live": None}]  # fmt: skip


def test_fleet_view_of_a_cpu_plan_shows_its_hosts_cores_and_ram(tmp_path: Path) -> None:
    from test_engine_vllm_cpu import CI_FLEET, TWO_CORES, _fleet

    from inferplane.console.usage import fleet_usd_per_hour
    from inferplane.planner import plan_fleet as plan_any_fleet

    plan = plan_any_fleet(load_fleet(_fleet(tmp_path, CI_FLEET)), cpu_host=TWO_CORES)
    source = FakeSource(plan, StateDir(tmp_path / "state"), _instances(plan))
    view = fleet_view(source, None)
    assert view["device"] == "cpu" and view["unplaced"] == []
    [node] = view["nodes"]
    [host] = node["cpus"]
    [planned_host] = plan.cpus
    assert node["gpus"] == [] and host["cores"] == [0, 1]
    assert host["memory_gib"] == planned_host.memory_gib
    by_id = {s["id"]: s for s in host["instances"]}
    assert {i: s["cores"] for i, s in by_id.items()} == {
        i.id: i.cpu_cores for i in plan.instances}
    # the shares add up to the RAM the planner counts as used
    assert sum(s["share_gib"] for s in by_id.values()) == pytest.approx(
        planned_host.used_gib, abs=0.01)
    html = pages.fleet_fragment(view)
    assert f'data-cpu-cores="0,1" data-memory-gib="{planned_host.memory_gib:.3f}"' in html
    assert 'data-core="0" data-instances="chat-0,embed-0"' in html
    assert 'data-core="1" data-instances="chat-1"' in html
    assert "without a card plan" not in html and "2 cores" in html
    usd, why = fleet_usd_per_hour(plan)  # not "$0": GPU prices say nothing of CPU hosts
    assert usd is None and why is not None and "CPU hosts" in why


# ---- models -----------------------------------------------------------------------------


async def test_models_view_names_states_restarts_routes_and_weights(
    console: tuple[GatewayApp, FakeSource],
) -> None:
    app, source = console
    source.instances[0].update(state="restarting", restarts=2, last_error="exited with code -9")
    source.instances[1].update(sleep_level=1)
    source.instances[2].update(scaling="draining")
    app.state.backends("chat")[0].ready = False
    view = models_view(app, source)
    reps = {r["name"]: r for m in view["models"] for r in m["replicas"]}
    assert reps["chat-0"]["state"] == "restarting" and reps["chat-0"]["restarts"] == 2
    assert not reps["chat-0"]["routable"] and reps["chat-1"]["routable"]
    assert reps["chat-1"]["state"] == "sleeping" and reps["embed-0"]["state"] == "draining"
    assert view["routes"] == [{"name": "chat", "targets": [
        {"model": "chat", "weight": 9.0, "share": 0.9},
        {"model": "embed", "weight": 1.0, "share": 0.1}]}]  # fmt: skip
    async with _client(app) as c:
        html = (await c.get("/ui/partials/models")).text
    assert 'data-instance="chat-0" data-state="restarting" data-restarts="2"' in html
    assert "exited with code -9" in html and 'hx-post="/ui/api/instances/chat-0/restart"' in html
    assert 'data-route="chat" data-target="chat" data-share="0.9"' in html


async def test_instance_logs_and_their_errors(console: tuple[GatewayApp, FakeSource]) -> None:
    app, source = console
    source.state_dir.log_dir.mkdir(parents=True)
    (source.state_dir.log_dir / "chat-0.log").write_text(
        "".join(f"line {i}\n" for i in range(30)))  # fmt: skip
    async with _client(app) as c:
        logs = (await c.get("/ui/api/instances/chat-0/logs?lines=3")).json()
        unknown = await c.get("/ui/api/instances/nope-0/logs")
        bad = await c.get("/ui/api/instances/chat-0/logs?lines=0")
        word = await c.get("/ui/api/instances/chat-0/logs?lines=many")
        html = (await c.get("/ui/partials/logs/chat-0?lines=2")).text
    assert logs["lines"] == ["line 27", "line 28", "line 29"]
    assert unknown.status_code == 404 and "chat-0, chat-1, embed-0" in unknown.text
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "lines"
    assert word.status_code == 400 and "whole number" in word.text
    assert "line 29" in html and "line 27" not in html


# ---- auth -------------------------------------------------------------------------------


async def test_the_console_needs_the_admin_token_when_auth_is_on(
    console: tuple[GatewayApp, FakeSource],
) -> None:
    app, _ = console
    app.tenancy = Tenancy(None, auth="on", admin_token="s3cret")
    async with _client(app) as c:
        for path in ("/ui/api/fleet", "/ui/api/series", "/ui/partials/fleet"):
            r = await c.get(path)
            assert r.status_code == 401 and r.json()["error"]["code"] == 401, path
            assert "chat-0" not in r.text
        page = await c.get("/ui/fleet")
        assert page.status_code == 401 and 'id="login"' in page.text
        assert "chat-0" not in page.text and "INFERPLANE_ADMIN_TOKEN" in page.text
        wrong = await c.get("/ui/api/fleet", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        ok = await c.get("/ui/api/fleet", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and ok.json()["nodes"]
        # the sign-in form sets a cookie holding an HMAC of the token, never the token
        bad = await c.post("/ui/login", data={"token": "nope"})
        assert bad.status_code == 401 and "wrong admin token" in bad.text
        signed = await c.post("/ui/login", data={"token": "s3cret"})
        assert signed.status_code == 303 and signed.headers["location"] == "/ui/fleet"
        cookie = signed.headers["set-cookie"]
        assert "s3cret" not in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
        c.cookies.set(COOKIE, cookie.partition("=")[2].partition(";")[0])
        assert (await c.get("/ui/fleet")).status_code == 200
        # a POST from a page elsewhere cannot carry the console's header
        forged = await c.post("/ui/api/instances/chat-0/restart")
        assert forged.status_code == 403 and "x-inferplane-console" in forged.text
        out = await c.post("/ui/logout")  # a plain form: no header needed to sign out
        assert out.status_code == 303 and "Max-Age=0" in out.headers["set-cookie"]


async def test_auth_on_without_an_admin_token_refuses_and_says_what_to_set(
    console: tuple[GatewayApp, FakeSource],
) -> None:
    app, _ = console
    app.tenancy = Tenancy(None, auth="on", admin_token=None)
    async with _client(app) as c:
        api = await c.get("/ui/api/models")
        page = await c.get("/ui/models")
    assert api.status_code == 403 and "export INFERPLANE_ADMIN_TOKEN" in api.text
    assert page.status_code == 403 and "chat-0" not in page.text


async def test_open_gateway_serves_every_page_and_the_console_can_be_off(
    console: tuple[GatewayApp, FakeSource],
) -> None:
    app, _ = console
    async with _client(app) as c:
        assert (await c.get("/ui")).headers["location"] == "/ui/fleet"
        for name in ("fleet", "models", "charts", "usage", "playground"):
            r = await c.get(f"/ui/{name}")
            assert r.status_code == 200 and f'data-page="{name}"' in r.text, name
            assert "default-src 'self'" in r.headers["content-security-policy"]
        assert (await c.get("/ui/nope")).status_code == 404
        assert (await c.get("/ui/api/series?since=soon")).status_code == 400
    plain = build_app(GatewayConfig(models=(ModelRoute("m"),)))
    async with _client(plain) as c:
        off = await c.get("/ui/fleet")
    assert off.status_code == 404 and "console is off" in off.text


def test_up_attaches_the_console_unless_the_fleet_turns_it_off(tmp_path: Path) -> None:
    from inferplane.runtime import Runtime, RuntimeOptions

    for setting, attached in (("", True), ("gateway: {console: false}\n", False)):
        path = tmp_path / "fleet.yaml"
        path.write_text(f"engine: sim\n{setting}models:\n  - name: chat\n"
                        "    source: Qwen/Qwen3-0.6B\n")  # fmt: skip
        rt = Runtime(load_fleet(path), RuntimeOptions(state_dir=tmp_path / "s", tenancy=False))
        assert (rt.gateway.console is not None) == attached
        if attached:
            assert isinstance(rt.gateway.console, ConsoleApp)
            assert rt.gateway.console.source is rt


async def test_restart_without_a_runtime_is_refused(planned: tuple[Any, Plan]) -> None:
    spec, plan = planned
    app = build_app(gateway_config_from_fleet(spec, plan))
    console = attach(app, None, "INFERPLANE_ADMIN_TOKEN")
    async with _client(app) as c:
        r = await c.post("/ui/api/instances/chat-0/restart", headers={"x-inferplane-console": "1"})
        fleet = (await c.get("/ui/api/fleet")).json()
    await console.stop()
    assert r.status_code == 409 and "without `inferplane up`" in r.text
    assert fleet["nodes"] == []


# ---- the replica header -------------------------------------------------------------------


def test_responses_name_the_replica_that_served_them(harness: Harness) -> None:  # noqa: F811
    engine = harness.engine("m")
    app, url = harness.gateway(
        GatewayConfig(models=(ModelRoute("m", endpoints=(engine.url,)),), access_log=False)
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    # The console's playground sends its page's token (issue 30 item 17: API clients do not
    # learn engine addresses unless gateway.expose_replica_header is on).
    token = {"x-inferplane-replica-token": app.replica_header.token}
    plain = http.post(url + "/v1/chat/completions", json=body, headers=token)
    assert plain.status_code == 200 and plain.headers["x-inferplane-replica"] == "m-endpoint-0"
    with http.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True},
                     headers=token) as r:  # fmt: skip
        assert r.headers["x-inferplane-replica"] == "m-endpoint-0"
        r.read()
    for headers in ({}, {"x-inferplane-replica-token": "guessed"}):
        other = http.post(url + "/v1/chat/completions", json=body, headers=headers)
        assert other.status_code == 200 and "x-inferplane-replica" not in other.headers


# ---- the sampler --------------------------------------------------------------------------


def _engine_text(step: int) -> str:
    """A vLLM /metrics exposition after `step` rounds of 10 requests."""
    return (
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{engine="0",model_name="chat"}} {step}\n'
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0",model_name="chat"}} {2 * step}\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="chat"}} {0.1 * step}\n'
        "# TYPE vllm:prefix_cache_queries counter\n"
        f'vllm:prefix_cache_queries_total{{engine="0",model_name="chat"}} {1000 * step}\n'
        "# TYPE vllm:prefix_cache_hits counter\n"
        f'vllm:prefix_cache_hits_total{{engine="0",model_name="chat"}} {250 * step}\n'
        "# TYPE vllm:generation_tokens counter\n"
        f'vllm:generation_tokens_total{{engine="0",model_name="chat"}} {500 * step}\n'
        "# TYPE vllm:request_time_per_output_token_seconds histogram\n"
        f'vllm:request_time_per_output_token_seconds_bucket{{le="0.01"}} {0 * step}\n'
        f'vllm:request_time_per_output_token_seconds_bucket{{le="0.05"}} {10 * step}\n'
        f'vllm:request_time_per_output_token_seconds_bucket{{le="+Inf"}} {10 * step}\n'
        f"vllm:request_time_per_output_token_seconds_count {10 * step}\n"
        f"vllm:request_time_per_output_token_seconds_sum {0.3 * step}\n"
    )


async def test_sampler_turns_gateway_and_engine_metrics_into_points(
    console: tuple[GatewayApp, FakeSource],
) -> None:
    app, source = console
    step = {"n": 1}

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=_engine_text(step["n"]), content_type="text/plain")

    server = web.Application()
    server.router.add_get("/metrics", metrics)
    runner = web.AppRunner(server)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        source.instances[0]["url"] = f"http://127.0.0.1:{port}"  # chat-0 answers, the rest not
        assert app.console is not None
        sampler = app.console.sampler
        assert await sampler.sample_once() is None  # the baseline
        step["n"] = 3
        series = app.metrics.series("chat", "chat-0")  # the gateway names replicas
        for _ in range(6):
            series.count(200)
        series.count(503)
        for s in (0.02, 0.04, 0.2):
            series.ttft.observe(s)
        app.metrics.add_tokens("chat", 100, 20)
        await asyncio.sleep(0.05)
        point = await sampler.sample_once()
    finally:
        await runner.cleanup()
    assert point is not None
    dt = point["dt_s"]
    chat, rep = point["models"]["chat"], point["replicas"]["chat-0"]
    assert chat["requests_per_s"] == pytest.approx(7 / dt, rel=1e-3)
    assert rep["requests_per_s"] == pytest.approx(7 / dt, rel=1e-3)
    assert chat["errors_per_s"] == {"503": pytest.approx(1 / dt, rel=1e-3)}
    assert chat["tokens_per_s"] == pytest.approx(120 / dt, rel=1e-2)
    assert 0.025 <= chat["ttft_p50_s"] <= 0.05 and chat["ttft_p99_s"] > 0.1
    assert rep["live"] and rep["kv_cache_usage"] == pytest.approx(0.3)
    assert (rep["waiting"], rep["running"]) == (3, 6)
    assert rep["prefix_hit_rate"] == pytest.approx(0.25)  # 500 hits of 2000 queried tokens
    assert rep["generation_tokens_per_s"] == pytest.approx(1000 / dt, rel=1e-2)
    assert 0.01 < rep["tpot_p50_s"] <= 0.05
    assert chat["engine_waiting"] == 3 and chat["engine_running"] == 6
    dead = point["replicas"]["chat-1"]  # no engine behind it: no numbers, not zeros
    assert not dead["live"] and dead["kv_cache_usage"] is None and dead["waiting"] is None
    assert sampler.live["chat-0"]["kv_cache_usage"] == pytest.approx(0.3)
    async with _client(app) as c:
        kept = (await c.get("/ui/api/series?since=0")).json()["points"]
        later = (await c.get(f"/ui/api/series?since={point['t']}")).json()["points"]
        fleet = (await c.get("/ui/partials/fleet")).text
    assert [p["t"] for p in kept] == [point["t"]] and later == []
    assert 'data-kv-usage="0.3000"' in fleet  # the live reading beside the plan's numbers
    assert '<i class="used" style="width:30.0%"></i>' in fleet  # drawn inside the KV pool


async def test_sampler_notes_state_changes(console: tuple[GatewayApp, FakeSource]) -> None:
    app, source = console
    assert app.console is not None
    sampler = app.console.sampler
    sampler.source = source
    for state in ("ready", "restarting", "starting", "ready"):
        source.instances[0]["state"] = state
        sampler._note_states(sampler.replicas(), time.time())
    assert [(e["from"], e["to"]) for e in sampler.events["chat-0"]] == [
        (None, "ready"), ("ready", "restarting"), ("restarting", "starting"),
        ("starting", "ready")]  # fmt: skip


def test_quantiles_rates_and_resets() -> None:
    before = {0.1: 10.0, 0.5: 10.0, 1.0: 10.0, float("inf"): 10.0}
    after = {0.1: 10.0, 0.5: 20.0, 1.0: 30.0, float("inf"): 30.0}
    assert S.quantile(0.5, before, after) == pytest.approx(0.5)  # 10 in (0.1, .5], 10 in (.5, 1]
    assert S.quantile(0.25, before, after) == pytest.approx(0.3)
    assert S.quantile(0.5, after, after) is None  # nothing observed in between
    assert S.quantile(0.99, {}, {1.0: 1.0, float("inf"): 5.0}) == 1.0  # above the last bound
    reset = S.quantile(0.5, after, {0.1: 2.0, 0.5: 2.0, 1.0: 2.0, float("inf"): 2.0})
    assert reset is not None and reset <= 0.1  # a restarted engine counts from zero
    a = S.from_text('x_total{k="a"} 10\nx_total{k="b"} 5\n')
    b = S.from_text('x_total{k="a"} 30\nx_total{k="b"} 2\n')
    assert S.rate(a, b, "x_total", 2.0) == pytest.approx((32 - 15) / 2)
    assert S.rate(a, b, "x_total", 2.0, lambda d: d["k"] == "b") == pytest.approx(1.0)
    with pytest.raises(ValueError):
        S.from_text("not { an exposition\n")


# ---- usage --------------------------------------------------------------------------------


async def test_usage_per_key_model_and_day_with_the_gpu_cost_share(
    planned: tuple[Any, Plan], tmp_path: Path
) -> None:
    _, plan = planned
    assert (await usage_view(None, plan, None, 7))["tenancy"] is False
    store = await Store.open(f"sqlite:///{tmp_path / 'inferplane.db'}")
    try:
        row, _ = await create_key(store, "alice")
        tenancy = Tenancy(store, admin_token="t")
        await tenancy.refresh()
        assert tenancy.ledger is not None
        # the latest noon UTC gone by: the fleet's two hours fall on one day (at 00:30 they
        # spanned two days and only today's row had tokens)
        now = (time.time() - 43200) // 86400 * 86400 + 43200
        for i, (key, model, tokens) in enumerate(
            [(row.id, "chat", 300), (row.id, "chat", 300), (None, "embed", 400)]
        ):
            tenancy.ledger.add((now - 60 + i, f"r{i}", key, model, "-", tokens, 0, 200, False,
                                0.1, 0.01, 0.0))  # fmt: skip
        view = await usage_view(tenancy, plan, now - 7200, 7, now=now)
        with pytest.raises(Exception, match="between 1 and 366"):
            await usage_view(tenancy, plan, None, 0)
    finally:
        await store.close()
    assert view["tenancy"] and [k["name"] for k in view["active_keys"]] == ["alice"]
    by_key = {r["name"]: r for r in view["by_key"]}
    assert by_key["alice"]["total_tokens"] == 600 and by_key["anonymous"]["total_tokens"] == 400
    usd_h = view["fleet_usd_per_hour"]
    assert usd_h == pytest.approx(2 * 1.40)  # two L40S at the shipped price list's rate
    # two hours of the fleet, split 60/40 by tokens; the day rows share the same hours
    assert by_key["alice"]["cost_usd"] == pytest.approx(usd_h * 2 * 0.6, rel=1e-3)
    assert sum(r["cost_usd"] for r in view["by_model"]) == pytest.approx(usd_h * 2, rel=1e-3)
    assert sum(r["cost_usd"] for r in view["by_day"]) == pytest.approx(usd_h * 2, rel=1e-3)
    no_plan = await usage_view(None, None, None, 7)
    assert "tenancy is off" in no_plan["message"]


# ---- what the browser loads: our files only -----------------------------------------------


_EXTERNAL = re.compile(r"""(?:src|href|action)\s*=\s*["']?\s*(?:https?:)?//""", re.I)


async def test_no_cdn_anywhere_and_the_vendored_files_are_pinned(
    console: tuple[GatewayApp, FakeSource],
) -> None:
    app, _ = console
    async with _client(app) as c:
        pages = [(await c.get(f"/ui/{n}")).text
                 for n in ("fleet", "models", "charts", "usage", "playground")]  # fmt: skip
        assets = re.findall(r'(?:src|href)="(/ui/static/[^"]+)"', pages[0])
        assert len(assets) == 5
        for asset in assets:
            r = await c.get(asset)
            assert r.status_code == 200 and len(r.content) > 500, asset
        assert (await c.get("/ui/static/../app.py")).status_code == 404
    for text in pages:
        assert not _EXTERNAL.search(text)
    for path in STATIC.rglob("*"):
        if path.suffix in (".js", ".css", ".html"):
            text = path.read_text(encoding="utf-8")
            for host in ("cdn", "unpkg", "jsdelivr", "googleapis", "cloudflare"):
                assert host not in text.lower(), (path, host)
            assert not re.search(r"""(?:fetch|import)\s*\(\s*["'`]https?:""", text), path
    vendor = STATIC / "vendor"
    wanted = json.loads((vendor / "package.json").read_text())["dependencies"]
    lock = json.loads((vendor / "package-lock.json").read_text())["packages"]
    assert wanted == {"htmx.org": "2.0.11", "uplot": "1.6.32"}
    for name, version in wanted.items():
        assert lock[f"node_modules/{name}"]["version"] == version
        assert lock[f"node_modules/{name}"]["integrity"].startswith("sha512-")
    assert (vendor / "LICENSE.htmx").is_file() and (vendor / "LICENSE.uplot").is_file()
    # the committed files are the locked versions
    assert 'version:"2.0.11"' in (vendor / "htmx.min.js").read_text()
    assert "(v1.6.32)" in (vendor / "uPlot.iife.min.js").read_text()[:100]
    pyproject = (REPO / "pyproject.toml").read_text()
    for pattern in ('"**/*.html"', '"**/*.css"', '"**/*.js"', '"console/static/vendor/LICENSE.*"'):
        assert pattern in pyproject


def test_weighted_route_config_is_what_the_models_view_reads() -> None:
    config = GatewayConfig(
        models=(ModelRoute("a"), ModelRoute("b")),
        routes=(WeightedRoute("ab", (WeightedTarget("a", 3), WeightedTarget("b", 1))),),
    )
    view = models_view(build_app(config), None)
    assert [m["name"] for m in view["models"]] == ["a", "b"]
    assert view["routes"][0]["targets"][0] == {"model": "a", "weight": 3.0, "share": 0.75}


# ---- polish (issue 28, item 21) ---------------------------------------------------------


async def test_console_polish(console: tuple[GatewayApp, FakeSource]) -> None:
    app, _ = console
    async with _client(app) as client:
        fleet = (await client.get("/ui/fleet")).text
        models = (await client.get("/ui/models")).text
        missing = await client.get("/ui/nope")
    assert 'rel="icon"' in fleet  # a favicon
    # co-located instances: each its own shade of the bar colours, a swatch by its name
    assert "seg weights tone0" in fleet and "seg weights tone1" in fleet
    assert 'class="swatch tone1"' in fleet
    assert 'hx-swap="innerHTML show:#logs:top"' in models  # the logs panel comes into view
    assert missing.status_code == 404 and missing.headers["content-type"].startswith("text/html")
    assert "No such page" in missing.text and 'href="/ui/fleet"' in missing.text
    js = (Path(pages.__file__).parent / "static" / "console.js").read_text()
    assert "pre.scrollTop = pre.scrollHeight" in js  # logs open at the newest line


async def test_models_page_shows_which_replica_holds_which_adapter() -> None:
    from inferplane.gateway.lora import AdapterRoute

    urls = ("http://127.0.0.1:9101", "http://127.0.0.1:9102")
    config = GatewayConfig(models=(
        ModelRoute("base", endpoints=urls, adapters=(
            AdapterRoute("sql", "base", "/a/sql"), AdapterRoute("support", "base", "/a/support"),
        )),
        ModelRoute("plain", endpoints=("http://127.0.0.1:9103",)),
    ))
    app = build_app(config)
    attach(app, None, "INFERPLANE_ADMIN_TOKEN")
    app.adapters.learn(urls[0], ["sql", "support"])  # what each engine's /v1/models listed
    app.adapters.learn(urls[1], [])
    view = models_view(app, None)
    models = {m["name"]: m for m in view["models"]}
    assert models["base"]["adapters"] == ["sql", "support"] and models["plain"]["adapters"] == []
    assert [r["adapters"] for r in models["base"]["replicas"]] == [["sql", "support"], []]
    async with _client(app) as c:
        html = (await c.get("/ui/partials/models")).text
    base, plain = html.split('data-model="plain"')
    assert 'data-adapters="sql support"' in base and "<th>adapters held</th>" in base
    assert base.count("data-adapters-held=") == 2
    assert '<td data-adapters-held="sql support">sql, support</td>' in base
    assert '<td data-adapters-held=""><span class="nolive">none</span></td>' in base
    assert "adapters held" not in plain  # a model without adapters keeps its columns
    app.adapters.learn(urls[1], ["support"])  # the page reads the holdings live
    async with _client(app) as c:
        html = (await c.get("/ui/partials/models")).text
    assert '<td data-adapters-held="support">support</td>' in html
