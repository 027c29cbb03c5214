"""The gateway in front of simulated engines serving LoRA adapters: listing, affinity,
one load per replica on demand, bounded waits, refusals, holdings after a lost adapter,
weighted routes between adapters."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from test_gateway_fakes import Harness, async_http_client, harness, http  # noqa: F401

from inferplane.gateway import GatewayConfig, ModelRoute, WeightedRoute, WeightedTarget
from inferplane.gateway.config import Admission
from inferplane.gateway.lora import AdapterRoute
from inferplane.sim.config import SimEngineConfig
from inferplane.sim.host import EngineHandle, start_engine
from inferplane.sim.lora import lora_config

RUNTIME = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}


def _adapter(root: Path, name: str) -> str:
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text(json.dumps({"r": 8, "bias": "none"}))
    return str(path)


class Fleet:
    def __init__(self, h: Harness, root: Path) -> None:
        self.h = h
        self.paths = {n: _adapter(root, n) for n in ("sql", "support", "slow", "fixed")}
        self.engines: list[EngineHandle] = []
        base = [self._engine("base", [f"sql={self.paths['sql']}"]),
                self._engine("base", []), self._engine("base", [])]
        slow = self._engine("slow-base", [], load_time_s=5.0)
        fixed = self._engine("fixed-base", [], env={})
        adapters = (
            AdapterRoute("sql", "base", self.paths["sql"], ("sql-alias",)),
            AdapterRoute("support", "base", self.paths["support"]),
            AdapterRoute("broken", "base", str(root / "missing")),
        )
        self.config = GatewayConfig(
            models=(
                ModelRoute("base", endpoints=tuple(e.url for e in base), adapters=adapters),
                ModelRoute("slow-base", endpoints=(slow.url,),
                           adapters=(AdapterRoute("slow", "slow-base", self.paths["slow"]),),
                           admission=Admission(max_queue_wait_s=0.3)),
                ModelRoute("fixed-base", endpoints=(fixed.url,),
                           adapters=(AdapterRoute("fixed", "fixed-base", self.paths["fixed"]),)),
            ),
            routes=(WeightedRoute("assistant", (WeightedTarget("sql", 1),
                                                WeightedTarget("support", 1))),),
            access_log=False, expose_replica_header=True,
        )
        self.base = base
        self.app, self.url = h.gateway(self.config)

    def _engine(self, model: str, modules: list[str], load_time_s: float = 0.05,
                env: dict[str, str] | None = None) -> EngineHandle:
        lora = lora_config(True, max_loras=2, max_cpu_loras=8, modules=modules,
                           load_time_s=load_time_s, env=RUNTIME if env is None else env)
        handle = self.h.run(start_engine(SimEngineConfig(model=model, max_model_len=2048,
                                                         lora=lora)))
        self.engines.append(handle)
        return handle

    def close(self) -> None:
        for handle in self.engines:
            self.h.run(handle.stop())


@pytest.fixture()
def fleet(harness: Harness, tmp_path: Path) -> Iterator[Fleet]:  # noqa: F811
    f = Fleet(harness, tmp_path)
    harness.run(f.app.adapters.read_all())  # what the replicas hold at start
    yield f
    f.close()


def chat(url: str, model: str) -> httpx.Response:
    return http.post(url + "/v1/chat/completions", json={
        "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})


def replica_of(fleet: Fleet, reply: httpx.Response) -> int:
    # endpoints are named <model>-endpoint-<index> (never by URL: issue 30 item 17)
    return int(reply.headers["x-inferplane-replica"].rpartition("-")[2])


def test_models_lists_adapters_and_aliases_with_their_parent(fleet: Fleet) -> None:
    cards = {c["id"]: c for c in http.get(fleet.url + "/v1/models").json()["data"]}
    assert cards["sql"]["parent"] == "base" and cards["sql-alias"]["parent"] == "base"
    assert cards["support"]["parent"] == "base"
    assert "parent" not in cards["base"]
    one = http.get(fleet.url + "/v1/models/support").json()
    assert one["parent"] == "base"


def test_request_goes_to_the_replica_holding_the_adapter(fleet: Fleet) -> None:
    for name in ("sql", "sql-alias", "sql"):
        reply = chat(fleet.url, name)
        assert reply.status_code == 200
        assert reply.json()["model"] == "sql"  # the engine's name for it
        assert replica_of(fleet, reply) == 0
    assert fleet.app.adapters.loads == 0


def test_concurrent_first_requests_share_one_load(fleet: Fleet) -> None:
    async def two() -> list[httpx.Response]:
        async with async_http_client() as client:
            body = {"model": "support", "messages": [{"role": "user", "content": "x"}],
                    "max_tokens": 2}
            return list(await asyncio.gather(*(
                client.post(fleet.url + "/v1/chat/completions", json=body) for _ in range(2))))

    replies = asyncio.run(two())
    assert [r.status_code for r in replies] == [200, 200]
    assert {r.json()["model"] for r in replies} == {"support"}
    assert len({replica_of(fleet, r) for r in replies}) == 1
    assert fleet.app.adapters.loads == 1
    holder = replica_of(fleet, replies[0])
    assert fleet.base[holder].engine.loras.get("support") is not None
    assert replica_of(fleet, chat(fleet.url, "support")) == holder
    assert fleet.app.adapters.loads == 1


def test_unknown_adapter_is_openais_404(fleet: Fleet) -> None:
    reply = chat(fleet.url, "nope")
    assert reply.status_code == 404 and reply.json()["error"]["code"] == "model_not_found"


def test_refused_load_is_a_503_with_the_engines_reason(fleet: Fleet) -> None:
    reply = chat(fleet.url, "broken")
    assert reply.status_code == 503
    message = reply.json()["error"]["message"]
    assert "refused to load adapter `broken` (404)" in message
    assert "No adapter found for" in message


def test_load_wait_is_bounded_by_the_queue_wait(fleet: Fleet) -> None:
    reply = chat(fleet.url, "slow")
    assert reply.status_code == 503
    message = reply.json()["error"]["message"]
    assert message.startswith("adapter `slow` did not load on slow-base-endpoint-")
    assert "within 0.3 s" in reply.json()["error"]["message"]
    assert reply.headers["retry-after"] == "1"


def test_engine_without_runtime_loading_is_named(fleet: Fleet) -> None:
    reply = chat(fleet.url, "fixed")
    assert reply.status_code == 503
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" in reply.json()["error"]["message"]


def test_an_adapter_lost_by_the_engine_is_loaded_again(fleet: Fleet) -> None:
    # as after an engine restart: the replica no longer lists it
    gone = http.post(fleet.base[0].url + "/v1/unload_lora_adapter", json={"lora_name": "sql"})
    assert gone.status_code == 200
    fleet.h.run(fleet.app.adapters.read_all())
    assert not fleet.app.adapters.holds(fleet.base[0].url, "sql")
    reply = chat(fleet.url, "sql")
    assert reply.status_code == 200 and reply.json()["model"] == "sql"
    assert fleet.app.adapters.loads == 1


def test_weighted_route_splits_between_adapters(fleet: Fleet) -> None:
    answered = [chat(fleet.url, "assistant").json()["model"] for _ in range(4)]
    assert sorted(answered) == ["sql", "sql", "support", "support"]
    metrics = http.get(fleet.url + "/metrics").text
    assert 'model="support"' in metrics  # counted under the adapter's name


def test_affinity_prefers_warm_then_held_within_the_load_bound() -> None:
    from inferplane.gateway import Backend
    from inferplane.gateway.lora import AdapterAffinity
    from inferplane.gateway.scorers import RouteContext

    a, b, c = Backend("http://a"), Backend("http://b"), Backend("http://c")
    ctx = RouteContext(holders=frozenset({b.url, c.url}), warm=frozenset({c.url}))
    scorer = AdapterAffinity()
    assert scorer.score([a, b, c], ctx) == [0.0, 0.5, 1.0]
    c.outstanding = 4  # far above the average: spill to the other holder
    assert scorer.score([a, b, c], ctx) == [0.0, 0.5, 0.0]
    assert scorer.score([a, b, c], RouteContext()) == [0.0, 0.0, 0.0]  # not an adapter


def test_admin_routes_may_split_between_adapters() -> None:
    from inferplane.gateway.state import GatewayState
    from inferplane.tenancy.admin import BadInput
    from inferplane.tenancy.admin_checks import check_route_targets

    adapters = (AdapterRoute("sql", "base", "/a/sql"), AdapterRoute("support", "base", "/a/s"))
    state = GatewayState(GatewayConfig(models=(ModelRoute("base", adapters=adapters),)))
    check_route_targets(state, [("sql", 90), ("support", 10)])
    state.set_weights("assistant", [WeightedTarget("sql", 1), WeightedTarget("support", 1)])
    picked = [state.pick("assistant") for _ in range(2)]
    assert sorted(p[1].name for p in picked if p is not None and p[1] is not None) == [
        "sql", "support"]
    with pytest.raises(BadInput, match="models and adapters: base, sql, support"):
        check_route_targets(state, [("nope", 1)])


def test_a_retry_goes_only_to_a_replica_holding_the_adapter(
    harness: Harness, tmp_path: Path,  # noqa: F811
) -> None:
    from inferplane.sim.config import FaultConfig

    path = _adapter(tmp_path, "x")
    lora = lora_config(True, modules=[f"x={path}"], load_time_s=0.0, env=RUNTIME)
    bare = lora_config(True, load_time_s=0.0, env=RUNTIME)
    configs = [  # replica 0 holds x and fails every request; 1 and 2 differ in holding it
        SimEngineConfig(model="b", max_model_len=1024, lora=lora,
                        faults=FaultConfig(fail_rate=1.0)),
        SimEngineConfig(model="b", max_model_len=1024, lora=bare),
        SimEngineConfig(model="b", max_model_len=1024, lora=lora),
    ]
    handles = [harness.run(start_engine(c)) for c in configs]
    try:
        def gateway(urls: tuple[str, ...]) -> tuple[object, str]:
            config = GatewayConfig(models=(ModelRoute(
                "b", endpoints=urls, adapters=(AdapterRoute("x", "b", path),), retries=1,
                eject_after_5xx=100),), access_log=False, expose_replica_header=True)
            app, url = harness.gateway(config)
            harness.run(app.adapters.read_all())
            app.adapters.served(handles[0].url, "x", 1)  # replica 0 is tried first
            return app, url

        app, url = gateway((handles[0].url, handles[1].url))
        reply = chat(url, "x")  # nowhere else holds x: the first replica's 500 stands
        assert reply.status_code == 500 and app.adapters.loads == 0  # type: ignore[attr-defined]
        _, url = gateway((handles[0].url, handles[1].url, handles[2].url))
        reply = chat(url, "x")
        assert reply.status_code == 200 and reply.json()["model"] == "x"
        assert reply.headers["x-inferplane-replica"].endswith("-endpoint-2")
    finally:
        for handle in handles:
            harness.run(handle.stop())
