"""`inferplane trace` on a real `up`-style run (a Runtime on simulated engines): one request's
path and timings joined by request id across the gateway's access log, the engine's log and
the usage ledger; the runtime's monitoring targets follow the replicas (issue 16)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
import yaml
from sim_runtime import FAST
from typer.testing import CliRunner

from inferplane.cli.main import _register_commands, app
from inferplane.errors import USAGE_EXIT_CODE, InferplaneError
from inferplane.runtime import Runtime, RuntimeOptions
from inferplane.spec import load_fleet

ROOT = Path(__file__).resolve().parent.parent
RID = "trace-me-1"


# One fleet for the module (its start is most of the cost); the test that removes a
# replica runs last.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def runtime(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Runtime]:
    tmp_path = tmp_path_factory.mktemp("fleet")
    source = ROOT / "tests/data/models/Qwen--Qwen2.5-7B-Instruct"
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "engine: sim\n"
        "gpus:\n  nodes: [{name: n1, gpu_type: L40S, count: 2}]\n"
        f"models:\n  - name: chat\n    source: {source}\n    max_model_len: 4096\n"
        "    replicas: 2\n"
    )
    rt = Runtime(
        load_fleet(fleet),
        RuntimeOptions(state_dir=tmp_path / "state", gateway_port=0, settings=FAST,
                       fleet_path=str(fleet), grace_period_s=5,
                       monitoring_dir=tmp_path / "mon"),  # as `up --monitoring DIR`
    )
    await rt.start()
    assert await rt.wait_settled(60)
    yield rt
    await rt.drain_and_stop()


async def _until(check: object, timeout_s: float = 10) -> None:
    async def poll() -> None:
        while not check():  # type: ignore[operator]
            await asyncio.sleep(0.05)

    await asyncio.wait_for(poll(), timeout_s)


def _trace(state: Path, *args: str) -> tuple[int, str]:
    """Exit code and output as `main` gives them (an InferplaneError: its message, 2)."""
    _register_commands()
    result = CliRunner().invoke(app, ["trace", *args, "--state-dir", str(state)])
    if isinstance(result.exception, InferplaneError):
        return USAGE_EXIT_CODE, result.exception.render()
    return result.exit_code, result.output


async def test_trace_joins_access_log_engine_log_and_ledger(runtime: Runtime) -> None:
    state = runtime.state_dir.path
    body = {"model": "chat", "max_tokens": 5, "stream": True,
            "messages": [{"role": "user", "content": "hello"}]}  # fmt: skip
    async with httpx.AsyncClient(timeout=20) as http, http.stream(
        "POST", runtime.gateway_url + "/v1/chat/completions", json=body,
        headers={"X-Request-ID": RID},
    ) as r:
        assert r.status_code == 200
        await r.aread()
    assert runtime.tenancy is not None and runtime.tenancy.ledger is not None
    await runtime.tenancy.ledger.flush()
    access = state / "logs" / "gateway-access.log"
    await _until(lambda: access.is_file() and RID in access.read_text())
    logs = [p for p in (state / "logs").glob("chat-*.log")]
    await _until(lambda: any(f"chatcmpl-{RID}" in p.read_text() for p in logs))

    code, out = await asyncio.to_thread(_trace, state, RID, "--json")
    assert code == 0, out
    doc = json.loads(out)
    (req,) = doc["requests"]
    assert req["model"] == "chat" and req["status"] == 200 and req["completion_tokens"] == 5
    names = [e["event"] for e in req["events"]]
    assert names == ["received", "admitted", "replica chosen", "upstream first byte", "finished"]
    offsets = [e["offset_s"] for e in req["events"]]
    assert offsets == sorted(offsets)  # the phases in order on one clock
    assert req["events"][-1]["at"] - req["events"][0]["at"] == pytest.approx(req["total_s"])
    (line,) = doc["engine_log"]
    assert line["instance"] == req["instance"]  # the engine the gateway chose logged it
    assert req["replica"] == runtime.supervisor.records[req["instance"]].instance.url
    assert f"Received request chatcmpl-{RID}" in line["line"]
    (usage,) = doc["usage"]
    assert usage["request_id"] == RID and usage["completion_tokens"] == 5
    assert usage["replica"] == req["instance"] and usage["stream"] is True  # named, no URL

    code, out = await asyncio.to_thread(_trace, state, RID)
    assert code == 0
    assert f"request {RID}: model chat, replica {req['instance']} (" in out
    assert "status 200" in out
    assert "upstream first byte" in out and f"[{req['instance']}] " in out

    code, out = await asyncio.to_thread(_trace, state, "no-such-request")
    assert code == 2
    assert "not in the fleet's logs" in out and "gateway-access.log" in out


async def test_gateway_series_name_replicas_as_the_engine_targets_do(runtime: Runtime) -> None:
    """Issue 30 item 17 under `up`: the gateway's `replica` label is the instance, the
    `pod` the engines' scrape targets carry; no engine address in the open /metrics."""
    body = {"model": "chat", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}
    async with httpx.AsyncClient(timeout=20) as http:
        for _ in range(4):  # the two replicas take turns
            assert (await http.post(runtime.gateway_url + "/v1/chat/completions",
                                    json=body)).status_code == 200  # fmt: skip
        text = (await http.get(runtime.gateway_url + "/metrics")).text
    named = set(re.findall(r'inferplane_requests_total\{model="chat",replica="([^"]+)"', text))
    targets = json.loads((runtime.monitoring_dir / "targets/engines.json").read_text())
    assert named == {t["labels"]["pod"] for t in targets} == {"chat-0", "chat-1"}
    for rec in runtime.supervisor.records.values():
        assert rec.instance.url not in text and f":{rec.instance.port}" not in text


@pytest.mark.skipif(
    shutil.which("prometheus") is None,
    reason="prometheus is not installed (Debian: apt-get install prometheus)",
)
async def test_prometheus_scrapes_the_gateway_and_every_engine(
    runtime: Runtime, tmp_path: Path
) -> None:
    """The written config run by a real Prometheus: both jobs up, every rule loaded, and
    the engine series carry the labels the rules select on."""
    mon = runtime.monitoring_dir
    config = yaml.safe_load((mon / "prometheus.yml").read_text())
    config["global"]["scrape_interval"] = "1s"  # the first scrape at once, not within 15 s
    (mon / "fast.yml").write_text(yaml.safe_dump(config))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = await asyncio.create_subprocess_exec(
        "prometheus", f"--config.file={mon / 'fast.yml'}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    api = f"http://127.0.0.1:{port}/api/v1"
    try:
        async with httpx.AsyncClient(timeout=5) as http:
            async def healthy() -> dict[str, str]:
                while True:
                    try:
                        data = (await http.get(api + "/targets")).json()["data"]
                        health = {t["labels"]["pod"]: t["health"]
                                  for t in data["activeTargets"]}  # fmt: skip
                        if len(health) == 3 and set(health.values()) == {"up"}:
                            return health
                    except (httpx.HTTPError, KeyError, ValueError):
                        pass
                    await asyncio.sleep(0.2)

            health = await asyncio.wait_for(healthy(), 30)
            assert set(health) == {"gateway", "chat-0", "chat-1"}
            groups = (await http.get(api + "/rules")).json()["data"]["groups"]
            expected = yaml.safe_load((mon / "rules.yml").read_text())["groups"]
            assert sum(len(g["rules"]) for g in groups) == sum(len(g["rules"]) for g in expected)
            query = 'vllm:kv_cache_usage_perc{namespace="inferplane"}'
            for _ in range(50):
                result = (await http.get(api + "/query", params={"query": query})).json()
                pods = {r["metric"]["pod"] for r in result["data"]["result"]}
                if pods == {"chat-0", "chat-1"}:
                    break
                await asyncio.sleep(0.2)
            assert pods == {"chat-0", "chat-1"}
    finally:
        proc.terminate()
        await proc.wait()


async def test_monitoring_targets_follow_the_replicas(runtime: Runtime) -> None:
    mon = runtime.monitoring_dir
    assert mon.name == "mon" and not (runtime.state_dir.path / "monitoring").exists()
    state = json.loads(runtime.state_dir.state_file.read_text())
    assert state["monitoring_dir"] == str(mon.resolve())  # where `monitoring` finds it
    for name in ("prometheus.yml", "rules.yml", "grafana/dashboards/inferplane.json"):
        assert (mon / name).is_file(), name

    def engines() -> dict[str, str]:
        groups = json.loads((mon / "targets/engines.json").read_text())
        return {g["labels"]["pod"]: g["targets"][0] for g in groups}

    records = runtime.supervisor.records
    assert engines() == {
        name: f"127.0.0.1:{rec.instance.port}" for name, rec in records.items()
    }
    (gateway,) = json.loads((mon / "targets/gateway.json").read_text())
    assert gateway["targets"] == [runtime.gateway_url.removeprefix("http://")]
    assert gateway["labels"] == {"namespace": "inferplane", "pod": "gateway",
                                 "component": "gateway"}  # fmt: skip
    await runtime.remove_replica("chat-1")  # as the autoscaler does
    assert set(engines()) == {"chat-0"}
