"""Tenancy treats a LoRA adapter as a model (issue 27, item 4): a key's model list names
adapters (by the name the client sends), its RPM and budget count adapter requests, the
ledger holds one row per adapter under its canonical name, and a per-key route splits
between adapters. Simulated engines holding both adapters (--lora-modules), a real
gateway, SQLite."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_gateway_fakes import Harness, http

from inferplane.gateway import GatewayConfig, ModelRoute
from inferplane.gateway.app import build_app
from inferplane.gateway.lora import AdapterRoute
from inferplane.sim.config import SimEngineConfig
from inferplane.sim.host import EngineHandle, start_engine
from inferplane.sim.lora import lora_config
from inferplane.store import Store
from inferplane.tenancy.keys import create_key
from inferplane.tenancy.ledger import usage_report
from inferplane.tenancy.routes import set_route
from inferplane.tenancy.service import Tenancy


class Env:
    def __init__(self, h: Harness, store: Store, tenancy: Tenancy, url: str) -> None:
        self.h, self.store, self.tenancy, self.url = h, store, tenancy, url

    def key(self, name: str, **kw: object) -> tuple[str, str]:
        """(key id, secret) of a new key, live in the gateway."""
        key, secret = self.h.run(create_key(self.store, name, **kw))  # type: ignore[arg-type]
        self.h.run(self.tenancy.refresh())
        return key.id, secret

    def chat(self, secret: str, model: str) -> httpx.Response:
        return http.post(
            self.url + "/v1/chat/completions",
            headers={"Authorization": f"Bearer {secret}"},
            json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        )

    def ledger(self, by: str) -> list[dict[str, Any]]:
        assert self.tenancy.ledger is not None
        self.h.run(self.tenancy.ledger.flush())
        return self.h.run(usage_report(self.store, by))


def _adapter(root: Path, name: str) -> str:
    path = root / name
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"r": 8, "bias": "none"}))
    return str(path)


@pytest.fixture()
def env(tmp_path: Path) -> Iterator[Env]:
    h = Harness()
    sql, support = _adapter(tmp_path, "sql"), _adapter(tmp_path, "support")
    lora = lora_config(
        True, max_loras=2, modules=[f"sql={sql}", f"support={support}"], load_time_s=0.0
    )
    engine: EngineHandle = h.run(
        start_engine(SimEngineConfig(model="base", max_model_len=2048, lora=lora))
    )
    config = GatewayConfig(
        models=(
            ModelRoute(
                "base",
                endpoints=(engine.url,),
                adapters=(
                    AdapterRoute("sql", "base", sql, ("sql-assistant",)),
                    AdapterRoute("support", "base", support),
                ),
            ),
        ),
        access_log=False,
    )
    store = h.run(Store.open(f"sqlite:///{tmp_path / 'db.sqlite'}"))
    tenancy = Tenancy(store, None, auth="auto", refresh_s=0.05, ledger_flush_s=0.05)
    app = build_app(config, tenancy)
    url = h.serve(app)
    h.run(app.adapters.read_all())
    yield Env(h, store, tenancy, url)
    h.run(engine.stop())
    h.close()


def test_a_keys_model_list_names_adapters(env: Env) -> None:
    _, secret = env.key("sql-team", models=["sql"])
    ok = env.chat(secret, "sql")
    assert ok.status_code == 200 and ok.json()["model"] == "sql"
    for other in ("support", "base", "sql-assistant"):  # names, as for a model's aliases
        refused = env.chat(secret, other)
        assert refused.status_code == 403, other
        assert refused.json()["error"]["code"] == "model_not_allowed"
        assert f"may not use model `{other}`" in refused.json()["error"]["message"]
    listed = http.get(env.url + "/v1/models", headers={"Authorization": f"Bearer {secret}"})
    assert [(c["id"], c["parent"]) for c in listed.json()["data"]] == [("sql", "base")]


def test_rpm_and_budget_count_adapter_requests(env: Env) -> None:
    _, limited = env.key("rpm", rpm=3)
    codes = [env.chat(limited, m).status_code for m in ("sql", "support", "sql", "support")]
    assert codes == [200, 200, 200, 429]  # one key's limit across its adapters
    _, capped = env.key("budget", budget_tokens=3, budget_period="day")
    first = env.chat(capped, "support")  # its output alone (3 tokens) uses the budget up
    assert first.status_code == 200
    second = env.chat(capped, "sql")
    assert second.status_code == 429
    assert second.json()["error"]["type"] == "insufficient_quota"


def test_the_ledger_counts_each_adapter_by_its_name(env: Env) -> None:
    key_id, secret = env.key("metered")
    for model in ("sql", "sql-assistant", "support", "base"):
        assert env.chat(secret, model).status_code == 200
    rows = {r["model"]: r for r in env.ledger("model")}
    assert {m: r["requests"] for m, r in rows.items()} == {"sql": 2, "support": 1, "base": 1}
    assert all(r["completion_tokens"] == 3 * r["requests"] for r in rows.values())
    [mine] = [r for r in env.ledger("key") if r["key"] == key_id]
    assert mine["requests"] == 4


def test_a_per_key_route_splits_between_adapters(env: Env) -> None:
    key_id, secret = env.key("canary")
    env.h.run(set_route(env.store, "support", [("sql", 1)], key_id=key_id))
    env.h.run(env.tenancy.refresh())
    assert env.chat(secret, "support").json()["model"] == "sql"  # this key: all to sql
    _, other = env.key("everyone-else")
    assert env.chat(other, "support").json()["model"] == "support"
