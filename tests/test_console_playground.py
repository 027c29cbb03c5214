"""Rough edges a newcomer hit in the console (found trying the demo fleet): the model
pickers know which models embed, so the playground's first click sends a chat model a chat
request (the demo's first model is its embedding model); a wrong bearer token is called
wrong, not missing; an endpoint nothing checked is "external", not "ready"."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from inferplane.console import attach
from inferplane.gateway import GatewayConfig, ModelRoute, WeightedRoute, WeightedTarget
from inferplane.gateway.app import build_app
from inferplane.gateway.fleet import gateway_config_from_fleet
from inferplane.spec import load_fleet

OPTION = re.compile(r'<option value="([^"]+)"(?: data-kind="(\w+)")?>')


def _config() -> GatewayConfig:
    # The embedding model first, as in examples/demo.yaml.
    return GatewayConfig(
        models=(
            ModelRoute("embedder", task="embed", aliases=("text-embedding-3-small",)),
            ModelRoute("embedder-v2", task="embed"),
            ModelRoute("chat", aliases=("gpt-4o-mini",)),
        ),
        routes=(WeightedRoute("embed-canary", (WeightedTarget("embedder", 9),
                                               WeightedTarget("embedder-v2", 1))),),
    )  # fmt: skip


async def _page(config: GatewayConfig, name: str) -> str:
    app = build_app(config)
    attach(app, None, "INFERPLANE_TEST_NO_SUCH_TOKEN")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        response = await client.get(f"/ui/{name}")
    assert response.status_code == 200, response.text
    return response.text


async def test_playground_lists_chat_models_first_and_marks_each_models_kind() -> None:
    options = OPTION.findall(await _page(_config(), "playground"))
    models = [(m, k) for m, k in options if k]  # the kind <select> has no data-kind
    assert models[0] == ("chat", "chat")  # the default answers a chat request
    assert dict(models) == {
        "chat": "chat", "gpt-4o-mini": "chat", "embedder": "embeddings",
        "text-embedding-3-small": "embeddings", "embedder-v2": "embeddings",
        "embed-canary": "embeddings",
    }  # fmt: skip
    kinds = [m for m, k in options if not k]
    assert kinds == ["chat", "embeddings"]


async def test_charts_open_on_a_chat_model() -> None:
    page = await _page(_config(), "charts")
    chart_select = page[page.index('id="chart-model"'):]
    assert [m for m, _ in OPTION.findall(chart_select)] == ["chat", "embedder", "embedder-v2"]


def test_the_fleet_files_task_reaches_the_gateway_config(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "models:\n"
        "  - name: vectors\n    task: embed\n    endpoints: ['http://127.0.0.1:9']\n"
        "  - name: chat\n    endpoints: ['http://127.0.0.1:9']\n"
    )  # fmt: skip
    config = gateway_config_from_fleet(load_fleet(fleet))
    assert {m.name: m.task for m in config.models} == {"vectors": "embed", "chat": "generate"}


@pytest.mark.parametrize("page", ["playground", "charts"])
async def test_a_fleet_of_embedding_models_still_lists_them(page: str) -> None:
    config = GatewayConfig(models=(ModelRoute("e", task="embed"),))
    assert "e" in [m for m, _ in OPTION.findall(await _page(config, page))]


async def test_a_wrong_bearer_token_is_named_as_wrong_not_as_missing() -> None:
    from inferplane.tenancy.service import Tenancy

    app = build_app(_config())
    app.tenancy = Tenancy(None, auth="on", admin_token="s3cret")
    attach(app, None, "INFERPLANE_ADMIN_TOKEN")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        wrong = await client.get("/ui/api/models", headers={"Authorization": "Bearer sk-key"})
        missing = await client.get("/ui/api/models")
    assert wrong.status_code == missing.status_code == 401
    message = wrong.json()["error"]["message"]
    assert "not the gateway's admin token" in message and "INFERPLANE_ADMIN_TOKEN" in message
    assert "Bearer TOKEN" in missing.json()["error"]["message"]  # none sent: how to send it
    assert "chat" not in wrong.text  # no data either way


def test_an_endpoint_replica_is_external_not_ready_until_ejected() -> None:
    from inferplane.console.views import models_view
    from inferplane.gateway import Backend

    app = build_app(GatewayConfig(models=(ModelRoute("ext", endpoints=("http://127.0.0.1:9",)),)))
    (backend,) = app.state.backends("ext")
    assert isinstance(backend, Backend)

    def state() -> str:
        (model,) = models_view(app, None)["models"]
        (replica,) = model["replicas"]
        return str(replica["state"])

    assert state() == "external"  # nothing checked it: not "ready"
    backend.ejected = True  # what the gateway does after the replica's own failures
    assert state() == "ejected"
