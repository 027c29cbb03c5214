"""`--discover kubernetes`: every ready pod of a model is its own replica (issue 24).

The API server is `k8s_apiserver.FakeApiServer` (the real wire format, objects validated
by the kubernetes client's models); the pods are simulated engines on 127.0.0.2 and
127.0.0.3, standing in for pod IPs. The gateway is the real app with the real discovery
thread and the official client, configured from a kubeconfig as outside a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from k8s_apiserver import FakeApiServer, endpoint
from kubernetes.client import ApiClient

from inferplane.gateway import GatewayConfig, ModelRoute
from inferplane.gateway.app import GatewayApp, build_app
from inferplane.gateway.discovery.kubernetes import KubernetesDiscovery
from inferplane.gateway.discovery.plancaps import PlannedCaps, combined
from inferplane.gateway.discovery.podcaps import max_num_seqs
from inferplane.gateway.discovery.registry import DiscoveryOptions, make_source
from inferplane.gateway.discovery.slices import replicas_of
from inferplane.sim.config import SimEngineConfig
from inferplane.sim.host import EngineHandle, start_engine

SVC = "llama"  # the renderer's Service name for model "llama" (object_name)


async def until(pred: Callable[[], bool], timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        if loop.time() > deadline:
            raise AssertionError("condition not reached within the timeout")
        await asyncio.sleep(0.02)


@dataclass
class Cluster:
    api: FakeApiServer
    app: GatewayApp
    client: httpx.AsyncClient
    pods: dict[str, EngineHandle]
    discovery: KubernetesDiscovery

    def backends(self) -> dict[str, bool]:
        return {b.label: b.ready for b in self.app.state.backends("llama")}

    async def ask(self, max_tokens: int = 2) -> httpx.Response:
        return await self.client.post(
            "/v1/completions", json={"model": "llama", "prompt": "hi", "max_tokens": max_tokens}
        )

    async def replicas_answering(self, n: int = 12) -> set[str]:
        seen = set()
        for _ in range(n):
            r = await self.ask()
            assert r.status_code == 200, r.text
            seen.add(r.headers["x-inferplane-replica"])
        return seen

    async def pod(self, name: str, cap: int | None = None, **conditions: Any) -> None:
        h = self.pods[name]
        if cap is not None:
            self.api.put_pod(name, h.port, ["--model", "/w", "--max-num-seqs", str(cap)])
        await self.api.put_slice(f"{SVC}-{name}", SVC, h.port,
                                 [endpoint(h.host, name, **conditions)])


@contextlib.asynccontextmanager
async def _cluster(
    tmp_path: Path, *, start_api: bool = True, token: str | None = None,
    scorers: tuple[str, ...] = ("least_outstanding",), seqs: dict[str, int] | None = None,
    planned: PlannedCaps | None = None,
) -> AsyncIterator[Cluster]:
    seqs = seqs or {}
    pods = {
        name: await start_engine(SimEngineConfig(model="llama", host=ip,
                                                 max_num_seqs=seqs.get(name)))
        for name, ip in (("llama-0", "127.0.0.2"), ("llama-1", "127.0.0.3"))
    }
    api = FakeApiServer()
    if start_api:
        await api.start()
    config = GatewayConfig(
        models=(ModelRoute("llama", scorers=scorers),), access_log=False,
        expose_replica_header=True, engine_metrics_interval_s=0.05, health_interval_s=0.2,
    )
    app = build_app(config)
    discovery = KubernetesDiscovery(
        {SVC: "llama"}, None, kubeconfig=str(api.kubeconfig(tmp_path, token)),
        backoff_s=0.05, max_backoff_s=0.2, planned=planned,
    )
    app.discovery = discovery
    await app.startup()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
    try:
        yield Cluster(api, app, client, pods, discovery)
    finally:
        await client.aclose()
        await app.shutdown()
        await api.stop()
        for h in pods.values():
            await h.stop()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with _cluster(tmp_path) as c:
        yield c


async def test_traffic_follows_pods_added_unready_terminating_deleted(cluster: Cluster) -> None:
    c = cluster
    assert c.discovery.namespace == "ns"  # from the kubeconfig's context
    await c.pod("llama-0")
    await until(lambda: c.backends() == {"llama-0": True})
    assert await c.replicas_answering() == {"llama-0"}

    await c.pod("llama-1")  # a pod added
    await until(lambda: c.backends() == {"llama-0": True, "llama-1": True})
    assert await c.replicas_answering() == {"llama-0", "llama-1"}

    await c.pod("llama-1", ready=False)  # made not ready: kept, but no traffic
    await until(lambda: c.backends() == {"llama-0": True, "llama-1": False})
    assert await c.replicas_answering() == {"llama-0"}

    await c.pod("llama-1")
    await until(lambda: c.backends()["llama-1"])
    # Terminating with a request in flight: no new requests, the one in flight finishes.
    pool = c.app.state.pools["llama"]
    long = asyncio.create_task(c.ask(max_tokens=400))
    await until(lambda: sum(b.outstanding for b in pool.backends) == 1)
    busy = next(b for b in pool.backends if b.outstanding == 1)
    other = next(b for b in pool.backends if b is not busy)
    await c.pod(busy.label, ready=False, serving=True, terminating=True)
    await until(lambda: not busy.ready)
    assert busy.outstanding == 1, "the long request ended before the drain was tested"
    assert await c.replicas_answering(4) == {other.label}
    finished = await long
    assert finished.status_code == 200
    assert finished.headers["x-inferplane-replica"] == busy.label
    assert finished.json()["usage"]["completion_tokens"] > 0

    await c.api.delete_slice(f"{SVC}-{busy.label}")  # the pod is gone
    await until(lambda: c.backends() == {other.label: True})
    assert busy.outstanding == 0


async def test_watch_dropped_and_410_gone_resync_without_loss_or_duplicates(
    cluster: Cluster,
) -> None:
    c = cluster
    await c.pod("llama-0")
    await until(lambda: "llama-0" in c.backends())
    lists = c.api.requests.count("list")

    await c.api.drop_watches()  # mid-stream: the client resumes from its last version
    await c.pod("llama-1")
    await until(lambda: c.backends() == {"llama-0": True, "llama-1": True})
    assert c.api.requests.count("list") == lists  # resumed, not relisted

    # History compacted while the watch was away: the resume gets 410 Gone -> relist.
    c.api.expire()
    await c.api.drop_watches()
    await c.pod("llama-1", ready=False)
    await until(lambda: c.api.requests.count("list") > lists)
    await until(lambda: c.backends() == {"llama-0": True, "llama-1": False})
    urls = [b.url for b in c.app.state.backends("llama")]
    assert len(urls) == len(set(urls)) == 2
    # A change made after the relist still arrives (the new watch starts at the list).
    await c.api.delete_slice(f"{SVC}-llama-1")
    await until(lambda: c.backends() == {"llama-0": True})
    assert await c.replicas_answering(4) == {"llama-0"}


async def test_api_server_down_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="inferplane.gateway.discovery")
    async with _cluster(tmp_path, start_api=False) as c:
        r = await c.client.get("/ready")
        await until(lambda: c.discovery.status().error != "not listed yet")
        r = await c.client.get("/ready")
        assert r.status_code == 503
        body = r.json()
        assert body["discovery"]["synced"] is False
        assert "cannot reach the API server" in body["discovery"]["error"]
        assert "cannot reach the API server" in caplog.text
        assert (await c.ask()).status_code == 503

        await c.api.put_slice(f"{SVC}-llama-0", SVC, c.pods["llama-0"].port,
                              [endpoint("127.0.0.2", "llama-0")])
        await c.api.start()
        await until(lambda: c.discovery.status().synced)
        r = await c.client.get("/ready")
        assert r.status_code == 200, r.text
        assert r.json()["discovery"] == {"source": "kubernetes", "synced": True, "error": None}
        assert await c.replicas_answering(2) == {"llama-0"}
        assert "listed 1 endpointslices" in caplog.text


async def test_not_ready_before_the_first_list_even_when_models_wake_on_request(
    tmp_path: Path,
) -> None:
    async with _cluster(tmp_path, start_api=False) as c:
        c.app.state.pools["llama"].activator = lambda: True  # min_replicas: 0
        r = await c.client.get("/ready")
        assert r.status_code == 503
        assert r.json()["models_waking_on_request"] == ["llama"]
        assert r.json()["discovery"]["synced"] is False
        await c.api.start()
        await until(lambda: c.discovery.status().synced)
        assert (await c.client.get("/ready")).status_code == 200  # held from here on
        await c.api.stop()  # the API server goes away after a good list
        await until(lambda: c.discovery.status().error is not None)
        r = await c.client.get("/ready")
        assert r.status_code == 200, r.text  # the last list stays in force
        assert "cannot reach the API server" in r.json()["discovery"]["error"]


async def test_wrong_token_is_named_on_ready(tmp_path: Path) -> None:
    async with _cluster(tmp_path, token="stale-token") as c:
        await until(lambda: "401" in c.api.requests)
        await until(lambda: c.discovery.status().error != "not listed yet")
        r = await c.client.get("/ready")
        assert r.status_code == 503
        assert "HTTP 401" in r.json()["discovery"]["error"]
        assert "token" in r.json()["discovery"]["error"]


async def test_balances_by_each_pods_own_metrics(tmp_path: Path) -> None:
    # llama-0 runs one sequence at a time and has a queue; llama-1 is idle. Only the
    # engine-metrics scorer decides, from each pod's own /metrics.
    async with _cluster(tmp_path, scorers=("engine_metrics",), seqs={"llama-0": 1}) as c:
        await c.pod("llama-0")
        await c.pod("llama-1")
        await until(lambda: c.backends() == {"llama-0": True, "llama-1": True})
        busy = c.pods["llama-0"]
        async with httpx.AsyncClient(base_url=busy.url, timeout=60) as direct:
            load = [asyncio.create_task(direct.post("/v1/completions", json={
                "model": "llama", "prompt": "x", "max_tokens": 2000, "ignore_eos": True}))
                for _ in range(3)]
            pool = c.app.state.pools["llama"]
            by_name = {b.label: b for b in pool.backends}
            await until(lambda: (e := by_name["llama-0"].engine) is not None and e.waiting >= 1)
            await until(lambda: by_name["llama-1"].engine is not None)
            answered = [await c.ask() for _ in range(8)]
            assert {r.headers["x-inferplane-replica"] for r in answered} == {"llama-1"}
            for t in load:
                t.cancel()
            await asyncio.gather(*load, return_exceptions=True)


def test_registry_and_errors(tmp_path: Path) -> None:
    from inferplane.errors import InferplaneError

    with pytest.raises(InferplaneError, match="unknown discovery source"):
        make_source("consul", GatewayConfig(models=(ModelRoute("m"),)))
    with pytest.raises(InferplaneError, match="needs the models"):
        make_source("kubernetes", GatewayConfig())
    api = FakeApiServer()
    source = make_source("kubernetes", GatewayConfig(models=(ModelRoute("Llama.3-8B"),)),
                         DiscoveryOptions(namespace="prod",
                                          kubeconfig=str(api.kubeconfig(tmp_path))))
    assert isinstance(source, KubernetesDiscovery)
    assert source.namespace == "prod"
    assert source.services == {"llama-3-8b": "Llama.3-8B"}  # the renderer's Service name
    api.sock.close()


def test_without_the_client_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from inferplane.errors import InferplaneError

    monkeypatch.setitem(sys.modules, "kubernetes", None)  # import kubernetes -> ImportError
    with pytest.raises(InferplaneError, match=r"inferplane\[k8s\]"):
        KubernetesDiscovery({SVC: "llama"})


def test_in_a_pod_without_a_token_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from inferplane.errors import InferplaneError

    if Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists():
        pytest.skip("this machine is a pod with a ServiceAccount token")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    with pytest.raises(InferplaneError, match="no in-cluster Kubernetes configuration"):
        KubernetesDiscovery({SVC: "llama"})


# ---- the slice -> replica rules, against an obviously correct oracle -------------------

_ep = st.fixed_dictionaries({
    "ip": st.sampled_from(["10.0.0.1", "10.0.0.2", "10.0.0.3", "fd00::7"]),
    "ready": st.none() | st.booleans(),
    "serving": st.none() | st.booleans(),
    "terminating": st.none() | st.booleans(),
})


def _slice(name: str, eps: list[dict[str, Any]]) -> Any:
    raw = {"metadata": {"name": name, "labels": {"kubernetes.io/service-name": SVC}},
           "addressType": "IPv4",
           "ports": [{"name": "http", "port": 8000}],
           "endpoints": [{"addresses": [e["ip"]], "targetRef": {"kind": "Pod",
                          "name": "pod-" + e["ip"]},
                          "conditions": {k: e[k] for k in ("ready", "serving", "terminating")
                                         if e[k] is not None}} for e in eps]}
    return ApiClient().deserialize(orjson.dumps(raw).decode(), "V1EndpointSlice",
                                   "application/json")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(_ep, max_size=4), max_size=3))
def test_replicas_of_matches_oracle(slices: list[list[dict[str, Any]]]) -> None:
    got = replicas_of([_slice(f"s{i}", eps) for i, eps in enumerate(slices)])
    expected: dict[str, bool] = {}
    for eps in slices:
        for e in eps:
            ok = e["ready"] is not False and e["serving"] is not False and not e["terminating"]
            host = f"[{e['ip']}]" if ":" in e["ip"] else e["ip"]
            url = f"http://{host}:8000"
            expected[url] = expected.get(url, False) or ok
    assert {r.url: r.routable for r in got} == expected
    assert len(got) == len({r.url for r in got})  # each endpoint once, however many slices
    assert all(r.name.startswith("pod-") for r in got)


async def test_each_pod_is_capped_by_its_own_max_num_seqs(cluster: Cluster) -> None:
    c = cluster
    await c.pod("llama-0", cap=1)
    await c.pod("llama-1", cap=2)
    await until(lambda: len(c.backends()) == 2)
    caps = {b.label: b.max_concurrency for b in c.app.state.backends("llama")}
    assert caps == {"llama-0": 1, "llama-1": 2}  # the engine container's, not the sidecar's
    pool = c.app.state.pools["llama"]
    asks = [asyncio.create_task(c.ask(max_tokens=300)) for _ in range(4)]
    await until(lambda: len(pool.queue) == 1)  # 1 + 2 in flight, the fourth waits
    assert {b.label: b.outstanding for b in pool.backends} == {"llama-0": 1, "llama-1": 2}
    assert all(r.status_code == 200 for r in await asyncio.gather(*asks))

    # A pod that cannot be read (here: not found) keeps the model's default cap.
    await c.api.put_slice("llama-extra", SVC, 9, [endpoint("127.0.0.9", "gone-pod")])
    await until(lambda: "gone-pod" in c.backends())
    gone = next(b for b in c.app.state.backends("llama") if b.label == "gone-pod")
    assert gone.max_concurrency is None
    assert c.api.requests.count("pod") == 3  # each pod read once


async def test_the_plan_caps_each_pod_it_names_bounded_by_the_pods_own_flag(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="inferplane.gateway.discovery")
    planned = PlannedCaps({"llama-0": ("llama", 2), "llama-1": ("llama", 3),
                           "embed-0": ("embed", 50)})
    async with _cluster(tmp_path, planned=planned) as c:
        api = c.api
        # llama-0: planned 2, but its engine runs 4 (a hand edit): the smaller, logged.
        api.put_pod("llama-0", c.pods["llama-0"].port, ["--max-num-seqs", "4"],
                    {"inferplane.io/instances": "llama-0"})
        # llama-1: co-located with embed-0, no flag of its own: the plan's, for llama's id.
        api.put_pod("llama-1", c.pods["llama-1"].port, ["--model", "/w"],
                    {"inferplane.io/instances": "embed-0,llama-1"})
        # A pod the plan lacks (hand-written, another plan): its own flag, as without a plan.
        api.put_pod("extra", 9, ["--max-num-seqs", "5"], {"inferplane.io/instances": "x-0"})
        for name in ("llama-0", "llama-1"):
            await c.pod(name)
        await api.put_slice("llama-extra", SVC, 9, [endpoint("127.0.0.9", "extra")])
        await until(lambda: len(c.backends()) == 3)
        caps = {b.label: b.max_concurrency for b in c.app.state.backends("llama")}
        assert caps == {"llama-0": 2, "llama-1": 3, "extra": 5}
        assert "pod llama-0 runs --max-num-seqs 4, its plan instance 2" in caplog.text


@given(st.none() | st.integers(1, 2048), st.none() | st.integers(1, 2048))
def test_combined_cap_never_exceeds_either_number(planned: int | None, own: int | None) -> None:
    cap = combined(planned, own)
    given_caps = [v for v in (planned, own) if v is not None]
    assert cap == (min(given_caps) if given_caps else None)


def test_planned_caps_from_a_rendered_plan() -> None:
    from deploy_plans import s0

    _, plan, _ = s0()
    caps = PlannedCaps.from_plan(plan)
    inst = plan.instances[-1]
    pod = _pod([{"args": ["--max-num-seqs", "1"]}], {"inferplane.io/instances":
                                                      f"nope-0,{inst.id}"})
    assert caps.cap(pod, inst.model) == inst.max_num_seqs
    assert caps.cap(pod, "another-model") is None
    assert caps.cap(_pod([{"args": []}]), inst.model) is None  # no annotation


def _pod(containers: list[dict[str, Any]], annotations: dict[str, str] | None = None) -> Any:
    raw = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "annotations": annotations or {}},
           "spec": {"containers": [{"name": f"c{i}", **c} for i, c in enumerate(containers)]}}
    return ApiClient().deserialize(orjson.dumps(raw).decode(), "V1Pod", "application/json")


@pytest.mark.parametrize(
    ("containers", "expected"),
    [
        ([{"args": ["--max-num-seqs", "64"], "ports": [{"containerPort": 8000}]}], 64),
        ([{"command": ["vllm", "serve", "--max-num-seqs=32"]}], 32),  # the only container
        ([{"args": ["--max-num-seqs", "9"]},  # a sidecar, not on the endpoint's port
          {"args": ["--max-model-len", "4096"], "ports": [{"containerPort": 8000}]}], None),
        ([{"args": ["--max-num-seqs", "lots"], "ports": [{"containerPort": 8000}]}], None),
        ([{"args": ["--max-num-seqs", "0"], "ports": [{"containerPort": 8000}]}], None),
        ([{"args": ["--max-num-seqs", "8"], "ports": [{"containerPort": 8001}]},
          {"args": ["--max-num-seqs", "16"], "ports": [{"containerPort": 8000}]}], 16),
    ],
)
def test_max_num_seqs_of_the_container_on_the_port(
    containers: list[dict[str, Any]], expected: int | None
) -> None:
    for c in containers:
        c.setdefault("image", "vllm/vllm-openai")
    assert max_num_seqs(_pod(containers), 8000) == expected


# ---- the command itself ------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def _gateway_process(
    tmp_path: Path, fleet: Path, api: FakeApiServer, *extra: str, **env_extra: str
) -> AsyncIterator[tuple[httpx.AsyncClient, list[bytes]]]:
    """`inferplane gateway --discover kubernetes` as its own process, once /ready says 200;
    yields a client and, after the block, its stderr lines."""
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    env.update(KUBECONFIG=str(api.kubeconfig(tmp_path)), NO_COLOR="1",
               INFERPLANE_STATE_DIR=str(tmp_path / "state"), **env_extra)
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "inferplane", "gateway", "--fleet", str(fleet),
        "--discover", "kubernetes", "--namespace", "ns", *extra,
        "--host", "127.0.0.1", "--port", str(port),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )
    lines: list[bytes] = []
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while True:
                assert proc.returncode is None and loop.time() < deadline
                try:
                    if (await http.get("/ready")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
            yield http, lines
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
        _, stderr = await asyncio.wait_for(proc.communicate(), 20)
        lines.extend(stderr.splitlines())


async def test_cli_gateway_discovers_pods_from_kubeconfig(tmp_path: Path) -> None:
    # As rendered: the fleet file and plan.json (ConfigMaps), the pod annotated with its
    # plan instance, the pod spec without --max-num-seqs: the plan's 1 is the cap, not 256.
    from deploy_plans import _plan, instance

    engine = await start_engine(SimEngineConfig(model="llama", host="127.0.0.2"))
    api = FakeApiServer()
    await api.start()
    api.put_pod("llama-0", engine.port, ["--model", "/w"], {"inferplane.io/instances": "llama-0"})
    await api.put_slice(f"{SVC}-abc12", SVC, engine.port, [endpoint("127.0.0.2", "llama-0")])
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("models:\n  - name: llama\n    source: Qwen/Qwen3-0.6B\n"
                     "gateway:\n  expose_replica_header: true\n")
    plan = tmp_path / "plan.json"
    plan.write_text(_plan(str(fleet), [instance(
        "llama", 0, node="n", gpu_type="L4", gpus=[0], port=engine.port, util=0.9,
        weights_gib=1.0, source="/w", seqs=1)], []).model_dump_json())
    long = {"model": "llama", "prompt": "x", "max_tokens": 2000, "ignore_eos": True,
            "stream": True}  # a client that leaves ends the stream upstream too
    try:
        async with _gateway_process(tmp_path, fleet, api, "--no-tenancy", "--plan",
                                    str(plan)) as (http, stderr):
            r = await http.post("/v1/completions", json={"model": "llama", "prompt": "hi",
                                                         "max_tokens": 2})
            assert r.status_code == 200, r.text
            assert r.headers["x-inferplane-replica"] == "llama-0"
            assert (await http.get("/ready")).json()["discovery"]["synced"] is True
            busy = [asyncio.create_task(http.post("/v1/completions", json=long))
                    for _ in range(2)]
            deadline = asyncio.get_running_loop().time() + 15
            while 'inferplane_queue_depth{model="llama"} 1.0' not in (
                    await http.get("/metrics")).text:  # one runs, the second waits
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.1)
            for t in busy:
                t.cancel()
            await asyncio.gather(*busy, return_exceptions=True)
    finally:
        await api.stop()
        await engine.stop()
    assert b"kubernetes discovery: listed 1 endpointslices in namespace ns" in b"\n".join(stderr)
    logged = [orjson.loads(line) for line in stderr if line.startswith(b"{")]
    replicas = {line["replica"] for line in logged if line.get("model") == "llama"}
    assert replicas - {"-"} == {"llama-0"}  # "-": the queued request, cancelled waiting


HA_FLEET = """\
models:
  - {name: v1, source: Qwen/Qwen3-0.6B}
  - {name: v2, source: Qwen/Qwen3-0.6B}
  - {name: night, source: Qwen/Qwen3-0.6B}
routes:  # a canary of v2 on the name v1, at 0% to start
  - model: v1
    backends: [{target: v1, weight: 100}, {target: v2, weight: 0}]
scaling:
  models:
    night: {min_replicas: 0, max_replicas: 1}
gateway:
  auth: "on"
  expose_replica_header: true
"""


async def test_two_gateway_processes_agree_on_limits_routes_and_holds(tmp_path: Path) -> None:
    # Issue 24.3, as the render runs it: two gateway processes, one Redis (limits), one
    # database (keys, routes), one cluster (the stand-in API server), pods on loopback IPs.
    from tenancy_fixtures import NO_REDIS, REDIS_URL

    from inferplane.store import Store
    from inferplane.tenancy.keys import create_key

    if not REDIS_URL:
        pytest.skip(NO_REDIS)
    engines = {name: await start_engine(SimEngineConfig(model=name, host=ip))
               for name, ip in (("v1", "127.0.0.2"), ("v2", "127.0.0.3"),
                                ("night", "127.0.0.4"))}
    api = FakeApiServer()
    await api.start()
    for name in ("v1", "v2"):
        h = engines[name]
        await api.put_slice(f"{name}-x", name, h.port, [endpoint(h.host, f"{name}-0")])
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(HA_FLEET)
    db = f"sqlite:///{tmp_path / 'shared.db'}"
    store = await Store.open(db)
    _, limited = await create_key(store, "limited", rpm=2)
    free_key, free = await create_key(store, "free")
    await store.close()
    env = {"INFERPLANE_REDIS_URL": REDIS_URL, "INFERPLANE_ADMIN_TOKEN": "admin-secret"}
    body = {"prompt": "hi", "max_tokens": 2}
    try:
        async with contextlib.AsyncExitStack() as stack:
            (a, _), (b, _) = await asyncio.gather(*(  # both start at once
                stack.enter_async_context(_gateway_process(tmp_path, fleet, api, "--db", db,
                                                           **env)) for _ in range(2)))
            key = {"Authorization": f"Bearer {free}"}

            async def replica(gw: httpx.AsyncClient, model: str) -> str:
                r = await gw.post("/v1/completions", json={**body, "model": model},
                                  headers=key)
                assert r.status_code == 200, r.text
                return r.headers["x-inferplane-replica"]

            # Limits: 2 per minute for the key across both gateways, not per gateway.
            lim = {"Authorization": f"Bearer {limited}"}
            codes = [(await gw.post("/v1/completions", json={**body, "model": "v2"},
                                    headers=lim)).status_code for gw in (a, b, a, b)]
            assert codes == [200, 200, 429, 429]

            # Canary weights: changed once (on gateway A), in force on both.
            assert {await replica(gw, "v1") for gw in (a, b) for _ in range(3)} == {"v1-0"}
            r = await a.put("/admin/routes/v1", json={"targets": {"v1": 0, "v2": 1}},
                            headers={"Authorization": "Bearer admin-secret"})
            assert r.status_code == 200, r.text
            for gw in (a, b):  # each reloads from the database (every 2 s)
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 15
                while await replica(gw, "v1") != "v2-0":
                    assert loop.time() < deadline, "the route did not reload"
                    await asyncio.sleep(0.2)
            assert {await replica(gw, "v1") for gw in (a, b) for _ in range(3)} == {"v2-0"}

            # Routes: a name made on B, one key's override made on A, the name deleted on
            # A, a key made on A and revoked on B: each in force on both gateways.
            admin = {"Authorization": "Bearer admin-secret"}

            async def on_both(check: Callable[[httpx.AsyncClient], Awaitable[bool]]) -> None:
                for gw in (a, b):
                    loop = asyncio.get_running_loop()
                    deadline = loop.time() + 15
                    while not await check(gw):
                        assert loop.time() < deadline, "the change did not reach a gateway"
                        await asyncio.sleep(0.2)

            async def answer(gw: httpx.AsyncClient, model: str, secret: str = free) -> str:
                """The replica that answered, else the status code."""
                r = await gw.post(
                    "/v1/completions",
                    json={**body, "model": model},
                    headers={"Authorization": f"Bearer {secret}"},
                )
                return r.headers["x-inferplane-replica"] if r.is_success else str(r.status_code)

            assert [await answer(gw, "beta") for gw in (a, b)] == ["404", "404"]
            r = await b.put("/admin/routes/beta", json={"targets": {"v2": 1}}, headers=admin)
            assert r.status_code == 200, r.text
            await on_both(lambda gw: _is(answer(gw, "beta"), "v2-0"))
            r = await a.put(
                "/admin/routes/v1",
                headers=admin,
                json={"targets": {"v1": 1}, "key_id": free_key.id},
            )
            assert r.status_code == 200, r.text
            await on_both(lambda gw: _is(answer(gw, "v1"), "v1-0"))  # the free key's own
            r = await a.delete("/admin/routes/beta", headers=admin)
            assert r.status_code == 200, r.text
            await on_both(lambda gw: _is(answer(gw, "beta"), "404"))
            r = await a.post("/admin/keys", json={"name": "late"}, headers=admin)
            assert r.status_code == 201, r.text
            late, late_id = r.json()["key"], r.json()["id"]
            await on_both(lambda gw: _is(answer(gw, "v2", late), "v2-0"))
            r = await b.post(f"/admin/keys/{late_id}/revoke", headers=admin)
            assert r.status_code == 200, r.text
            await on_both(lambda gw: _is(answer(gw, "v2", late), "401"))

            # Scale from zero: `night` has no pod; a request on each gateway is held.
            held = [
                asyncio.create_task(
                    gw.post("/v1/completions", headers=key, json={**body, "model": "night"})
                )
                for gw in (a, b)
            ]

            async def queued(gw: httpx.AsyncClient) -> bool:
                text = (await gw.get("/metrics")).text
                return 'inferplane_queue_depth{model="night"} 1.0' in text

            deadline = asyncio.get_running_loop().time() + 15
            while not (await queued(a) and await queued(b)):
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.1)
            # KEDA activates the workload on the held requests (here: gateway B's); its
            # pod starts, is listed not ready, then ready: both held requests go to it.
            h = engines["night"]
            await api.put_slice(
                "night-x", "night", h.port, [endpoint(h.host, "night-0", ready=False)]
            )
            await asyncio.sleep(0.5)
            assert not any(t.done() for t in held)  # a pod that is not ready takes nothing
            await api.put_slice("night-x", "night", h.port, [endpoint(h.host, "night-0")])
            answers = await asyncio.wait_for(asyncio.gather(*held), 20)
            assert [r.status_code for r in answers] == [200, 200]
            assert {r.headers["x-inferplane-replica"] for r in answers} == {"night-0"}
    finally:  # the Redis counters are under the new keys' ids: nothing to clean up
        await api.stop()
        for h in engines.values():
            await h.stop()


async def _is(value: Awaitable[object], expected: object) -> bool:
    return await value == expected


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--discover", "kubernetes"], "--fleet FLEET.yaml too"),
        (["--backend", "m=http://127.0.0.1:9", "--namespace", "ns"], "--discover kubernetes"),
        (["--fleet", "FLEET", "--discover", "consul"], "use one of: kubernetes"),
        (["--plan", "PLAN", "--backend", "m=http://127.0.0.1:9"], "--fleet FLEET.yaml too"),
        (["--fleet", "FLEET", "--plan", "PLAN"], "re-create the plan from this fleet file"),
        (["--fleet", "FLEET", "--plan", "FLEET"], "not a valid plan"),
    ],
)
def test_cli_discovery_errors_name_the_fix(args: list[str], needle: str, tmp_path: Path) -> None:
    from deploy_plans import s0
    from typer.testing import CliRunner

    from inferplane.cli.main import _register_commands, app
    from inferplane.errors import InferplaneError

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("models:\n  - name: llama\n    source: Qwen/Qwen3-0.6B\n")
    plan = tmp_path / "plan.json"
    plan.write_text(s0()[1].model_dump_json())  # another fleet's plan
    _register_commands()
    argv = [{"FLEET": str(fleet), "PLAN": str(plan)}.get(a, a) for a in args]
    r = CliRunner().invoke(app, ["gateway", "--no-tenancy", *argv])
    assert isinstance(r.exception, InferplaneError)
    assert needle in str(r.exception)


def test_cli_discovery_error_exits_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "inferplane", "gateway", "--no-tenancy", "--discover", "kubernetes"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"},
    )
    assert proc.returncode == 2, proc.stderr
    assert "--fleet FLEET.yaml too" in proc.stderr
