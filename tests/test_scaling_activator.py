"""Scale from zero behind a Service (the in-cluster gateway): while nothing answers at
the model's URL the request is held, then answered once an engine comes up there."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from inferplane.cli.main import _register_commands, app
from inferplane.gateway import build_app
from inferplane.gateway.config import Admission, GatewayConfig, ModelRoute
from inferplane.runtime.instances import free_port
from inferplane.scaling.activator import ActivatingApp, with_zero_activation
from inferplane.sim.config import SimEngineConfig
from inferplane.sim.host import start_engine


async def _get(asgi: Any, path: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=asgi)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        return await client.get(path)


async def test_a_request_to_a_service_with_no_pod_is_held_until_one_answers() -> None:
    port = free_port()
    config = GatewayConfig(models=(
        ModelRoute("night", endpoints=(f"http://127.0.0.1:{port}",),
                   admission=Admission(max_queue_depth=8, max_queue_wait_s=20)),
        ModelRoute("day", endpoints=("http://127.0.0.1:9",)),
    ))
    app = build_app(config)
    asgi = with_zero_activation(app, ["night"])
    assert isinstance(asgi, ActivatingApp)
    await app.startup()
    engine = None
    try:
        activator = asgi.activator
        await activator.probe_once()  # nothing listens: not ready, requests are held
        assert not app.state.pools["night"].backends[0].ready
        ready = await _get(asgi, "/ready")
        assert ready.status_code == 200  # the gateway takes night's requests: it holds them
        assert ready.json() == {"status": "ready", "models_waking_on_request": ["night"]}
        app.state.pools["day"].backends[0].ready = False  # a floor model with no replica
        ready = await _get(asgi, "/ready")
        assert ready.status_code == 503
        assert ready.json() == {"status": "not ready", "models_without_replicas": ["day"],
                                "models_waking_on_request": ["night"]}
        # an autoscaled model whose activator declines (replicas exist, none healthy: the
        # supervisor's business, requests get 503) is not counted as waking
        app.state.pools["day"].activator = lambda: False
        ready = await _get(asgi, "/ready")
        assert ready.status_code == 503 and ready.json()["models_without_replicas"] == ["day"]
        app.state.pools["day"].activator = None
        app.state.pools["day"].backends[0].ready = True
        activator.start()
        transport = httpx.ASGITransport(app=asgi)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw",
                                     timeout=30) as client:
            held = asyncio.create_task(client.post("/v1/chat/completions", json={
                "model": "night", "max_tokens": 3,
                "messages": [{"role": "user", "content": "hi"}]}))
            await asyncio.sleep(0.5)
            assert not held.done() and len(app.state.pools["night"].queue) == 1
            metrics = (await client.get("/metrics")).text
            assert 'inferplane_queue_depth{model="night"} 1.0' in metrics  # KEDA's trigger
            engine = await start_engine(SimEngineConfig(model="night", port=port))  # "pod"
            resp = await held
        assert resp.status_code == 200, resp.text
        # models with a floor keep the 503: no activator on them
        assert app.state.pools["day"].activator is None
        await activator.stop()
    finally:
        if engine is not None:
            await engine.stop()
        await app.shutdown()
    assert with_zero_activation(build_app(config), []).__class__.__name__ == "GatewayApp"


def test_inferplane_gateway_wraps_models_that_scale_to_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "engine: sim\nmodels:\n"
        "  - {name: night, source: Qwen/Qwen3-0.6B, replicas: 0}\n"
        "  - {name: day, source: Qwen/Qwen3-0.6B}\n"
        "scaling:\n  models:\n    night: {min_replicas: 0, max_replicas: 2}\n"
        "    day: {min_replicas: 1, max_replicas: 2}\n"
    )
    seen: dict[str, Any] = {}

    def fake_serve(config: GatewayConfig, host: Any, port: Any, tenancy: Any,
                   wrap: Any = None, discovery: Any = None) -> None:
        seen["config"], seen["wrap"], seen["discovery"] = config, wrap, discovery

    monkeypatch.setattr("inferplane.gateway.server.serve", fake_serve)
    _register_commands()
    out = CliRunner().invoke(app, ["gateway", "--fleet", str(fleet), "--no-tenancy",
                                   "--backend", "night=http://night.svc:8000",
                                   "--backend", "day=http://day.svc:8000"])
    assert out.exit_code == 0, out.output
    wrapped = seen["wrap"](build_app(seen["config"]))
    assert isinstance(wrapped, ActivatingApp) and wrapped.activator.models == ["night"]


def test_discovered_pods_hold_for_scale_from_zero_without_health_probing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With --discover kubernetes readiness comes from the API (a draining pod must not be
    # re-admitted by a /health probe), so the model is only marked "held while empty".
    from k8s_apiserver import FakeApiServer

    from inferplane.gateway.discovery.kubernetes import KubernetesDiscovery

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "engine: sim\nmodels:\n"
        "  - {name: night, source: Qwen/Qwen3-0.6B, replicas: 0}\n"
        "  - {name: day, source: Qwen/Qwen3-0.6B}\n"
        "scaling:\n  models:\n    night: {min_replicas: 0, max_replicas: 2}\n"
        "    day: {min_replicas: 1, max_replicas: 2}\n"
    )
    api = FakeApiServer()
    monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig(tmp_path)))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    seen: dict[str, Any] = {}

    def fake_serve(config: GatewayConfig, host: Any, port: Any, tenancy: Any,
                   wrap: Any = None, discovery: Any = None) -> None:
        seen["config"], seen["wrap"], seen["discovery"] = config, wrap, discovery

    monkeypatch.setattr("inferplane.gateway.server.serve", fake_serve)
    _register_commands()
    out = CliRunner().invoke(app, ["gateway", "--fleet", str(fleet), "--no-tenancy",
                                   "--discover", "kubernetes"])
    api.sock.close()
    assert out.exit_code == 0, out.output
    assert isinstance(seen["discovery"], KubernetesDiscovery)
    assert seen["discovery"].services == {"night": "night", "day": "day"}
    gw = build_app(seen["config"])
    assert seen["wrap"](gw) is gw  # no ZeroActivator probing /health
    night, day = gw.state.pools["night"], gw.state.pools["day"]
    assert night.activator is not None and night.activator()
    assert day.activator is None
