"""A LoRA adapter served by real vLLM (CPU) through `inferplane up` and the gateway.

The tiny adapter (scripts/make_tiny_adapter.py) for tiny-llama, declared under
`models[].lora`; one replica, planned on this host's cores. Checked: `/v1/models` lists
the adapter with its parent, a chat to the adapter's name answers with that name, `status`
shows the replica holding it, and an adapter the engine lost (unloaded on its own port, as
after a restart) is loaded again by the gateway on the next request (vLLM's real
`/v1/load_lora_adapter`).
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from real_vllm import REPO, free_port
from test_cpu_fleet_up import _our_group

from inferplane.planner import plan_fleet
from inferplane.spec import load_fleet

BASE, ADAPTER = "tiny-chat", "tiny-sql"
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
  - name: {base}
    source: {llama}
    max_model_len: 512
    lora:
      max_loras: 1
      max_lora_rank: 8
      adapters:
        - {{name: {adapter}, source: {adapter_dir}}}
gateway: {{host: 127.0.0.1}}
"""


@dataclass
class Fleet:
    state: Path
    gateway: str

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "inferplane", *args, "--state-dir", str(self.state)],
            capture_output=True, text=True, timeout=timeout, check=False,
        )

    def instances(self) -> list[dict[str, Any]]:
        done = self.cli("status", "--json")
        assert done.returncode == 0, done.stderr
        return list(json.loads(done.stdout)["instances"])


@pytest.fixture(scope="module")
def fleet(vllm_venv: Path, tiny_models: dict[str, Path],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("lora-fleet")
    adapter_dir = root / "adapters" / ADAPTER
    made = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make_tiny_adapter.py"), str(adapter_dir),
         "--base", str(tiny_models["tiny-llama"]), "--rank", "8"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert made.returncode == 0, made.stderr
    fleet_file = root / "fleet.yaml"
    fleet_file.write_text(FLEET.format(
        base=BASE, adapter=ADAPTER, llama=tiny_models["tiny-llama"], adapter_dir=adapter_dir,
        cache=vllm_venv.parent / "vllm-cache"))
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
    up = subprocess.run(
        [sys.executable, "-m", "inferplane", "up", str(fleet_file), "--plan", str(plan_file),
         "--detach", "--state-dir", str(state), "--gateway-port", str(gateway_port),
         "--vllm-binary", str(vllm_venv / "bin" / "vllm"), "--no-tenancy", "--no-console",
         "--ready-timeout-s", str(READY_S)],
        capture_output=True, text=True, timeout=READY_S + 120, check=False,
    )  # fmt: skip
    out = Fleet(state, f"http://127.0.0.1:{gateway_port}")
    pids: list[int] = []
    try:
        logs = "\n".join((state / "logs" / f"{i.id}.log").read_text(errors="replace")[-4000:]
                         for i in moved if (state / "logs" / f"{i.id}.log").exists())
        assert up.returncode == 0, f"{up.stdout}\n{up.stderr}\n{logs}"
        pids = [i["pid"] for i in out.instances() if i["pid"]]
        yield out
    finally:
        if (state / "up.pid").exists():
            out.cli("down", "--force", timeout=120)
        for pgid in pids:  # never leave an engine behind, whatever failed
            if _our_group(pgid, vllm_venv):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)


def _chat(client: httpx.Client, model: str) -> httpx.Response:
    return client.post("/v1/chat/completions", json={
        "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})


def test_adapter_listed_with_parent_and_answers_by_name(fleet: Fleet) -> None:
    with httpx.Client(base_url=fleet.gateway, timeout=120) as client:
        cards = {c["id"]: c for c in client.get("/v1/models").json()["data"]}
        assert cards[ADAPTER]["parent"] == BASE
        reply = _chat(client, ADAPTER)
        assert reply.status_code == 200, reply.text
        assert reply.json()["model"] == ADAPTER
        assert reply.json()["usage"]["completion_tokens"] == 4
        assert _chat(client, "no-such-adapter").status_code == 404
    [inst] = fleet.instances()
    assert inst["adapters"] == [ADAPTER]  # read from the real engine's /v1/models


def test_an_adapter_the_engine_lost_is_loaded_again(fleet: Fleet) -> None:
    [inst] = fleet.instances()
    gone = httpx.post(inst["url"] + "/v1/unload_lora_adapter", json={"lora_name": ADAPTER},
                      timeout=60)
    assert gone.status_code == 200, gone.text
    deadline = time.monotonic() + 30
    while fleet.instances()[0]["adapters"] and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(4.0)  # the gateway re-reads every health interval (2 s)
    with httpx.Client(base_url=fleet.gateway, timeout=300) as client:
        reply = _chat(client, ADAPTER)
    assert reply.status_code == 200, reply.text
    assert reply.json()["model"] == ADAPTER
    assert fleet.instances()[0]["adapters"] == [ADAPTER]
