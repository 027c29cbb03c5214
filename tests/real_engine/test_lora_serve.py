"""A LoRA adapter served by real vLLM (CPU) through `inferplane up` and the gateway, and
the KV cache it gives up, on one fleet start.

The tiny adapter (scripts/make_tiny_adapter.py) for tiny-llama, declared under
`models[].lora` with 32 slots of rank 512; one replica, planned on this host's cores, with
the plan's explicit KV cache size swapped for `--gpu-memory-utilization 0.1` so that the
CPU worker sizes its KV cache as requested memory minus what the process holds (the LoRA
slots among it). A plain engine of the same base starts beside it on the other core, so the
module costs one engine start of wall time. Checked:

- the KV cache is smaller than the plain engine's by what estimator/lora.py computes
  (within 5 %), the base answers as without LoRA and the adapter changes the output;
- `/v1/models` through the gateway lists the adapter with its parent, a chat to the
  adapter's name answers with that name, `status` shows the replica holding it;
- an adapter the engine lost (unloaded on its own port, as after a restart) is loaded again
  by the gateway on the next request (vLLM's real `/v1/load_lora_adapter`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
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
from real_vllm import REPO, RealEngine, free_port, start_vllm
from test_cpu_fleet_up import _our_group

from inferplane.estimator.lora import LoraSlots, reservation_bytes, wrapped_modules
from inferplane.models import load_profile
from inferplane.planner import plan_fleet
from inferplane.spec import load_fleet

BASE, ADAPTER = "tiny-chat", "tiny-sql"
READY_S = float(os.environ.get("INFERPLANE_REAL_ENGINE_READY_S", "840"))
KV_TOKENS = re.compile(r"CPU KV cache size: ([\d,]+) tokens")
# requested memory = this x the node's RAM; small so two engines never strain the host
UTILIZATION = ["--gpu-memory-utilization", "0.1"]
SLOTS = LoraSlots(max_loras=32, max_lora_rank=512)  # big enough to measure on a tiny base

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
      max_loras: {max_loras}
      max_lora_rank: {max_lora_rank}
      adapters:
        - {{name: {adapter}, source: {adapter_dir}}}
gateway: {{host: 127.0.0.1}}
"""


@dataclass
class Fleet:
    state: Path
    gateway: str
    plain: RealEngine  # the same base without LoRA, beside the fleet
    log: Path  # the fleet engine's log

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "inferplane", *args, "--state-dir", str(self.state)],
            capture_output=True, text=True, timeout=timeout, check=False,
        )

    def instances(self) -> list[dict[str, Any]]:
        done = self.cli("status", "--json")
        assert done.returncode == 0, done.stderr
        return list(json.loads(done.stdout)["instances"])


def _scheduling(argv: list[str]) -> list[str]:
    """The plan's batch settings, for the plain engine: the profile run, whose buffers the
    CPU worker counts as held memory too, must be the same on both sides."""
    out: list[str] = []
    for flag in ("--max-num-seqs", "--max-num-batched-tokens"):
        if flag in argv:
            out += [flag, argv[argv.index(flag) + 1]]
    return out


def _measuring(argv: list[str]) -> list[str]:
    """The plan's command line with its explicit KV cache size (CPU fleets) replaced by a
    share of RAM, so the LoRA slots come out of the KV cache as on a GPU."""
    out = list(argv)
    at = out.index("--kv-cache-memory-bytes")
    out[at:at + 2] = UTILIZATION
    return out


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
        cache=vllm_venv.parent / "vllm-cache", max_loras=SLOTS.max_loras,
        max_lora_rank=SLOTS.max_lora_rank))
    plan = plan_fleet(load_fleet(fleet_file), fleet_file=str(fleet_file))
    moved = []
    for inst in plan.instances:
        port = free_port()
        argv = _measuring(list(inst.argv))
        argv[argv.index("--port") + 1] = str(port)
        env = {**inst.env, "VLLM_CPU_OMP_THREADS_BIND": "0"}  # core 1: the plain engine
        moved.append(inst.model_copy(update={"port": port, "argv": argv, "env": env}))
    plan_file = root / "plan.json"
    plan_file.write_text(plan.model_copy(update={"instances": moved}).model_dump_json())
    state = root / "state"
    gateway_port = free_port()
    plain = start_vllm(vllm_venv, tiny_models["tiny-llama"], BASE, root / "plain", cores="1",
                       kv_cache_bytes=None, extra_args=[*UTILIZATION, *_scheduling(moved[0].argv)],
                       wait=False)
    pids: list[int] = []
    out = Fleet(state, f"http://127.0.0.1:{gateway_port}", plain,
                state / "logs" / f"{moved[0].id}.log")
    try:
        up = subprocess.run(
            [sys.executable, "-m", "inferplane", "up", str(fleet_file), "--plan", str(plan_file),
             "--detach", "--state-dir", str(state), "--gateway-port", str(gateway_port),
             "--vllm-binary", str(vllm_venv / "bin" / "vllm"), "--no-tenancy", "--no-console",
             "--ready-timeout-s", str(READY_S)],
            capture_output=True, text=True, timeout=READY_S + 120, check=False,
        )  # fmt: skip
        logs = "\n".join((state / "logs" / f"{i.id}.log").read_text(errors="replace")[-4000:]
                         for i in moved if (state / "logs" / f"{i.id}.log").exists())
        assert up.returncode == 0, f"{up.stdout}\n{up.stderr}\n{logs}"
        # the status `up` prints once ready names what the engine loaded (--lora-modules)
        assert f"{moved[0].id} adapters: {ADAPTER}" in up.stdout, up.stdout
        pids = [i["pid"] for i in out.instances() if i["pid"]]
        plain.wait_ready()
        yield out
    finally:
        plain.stop()
        if (state / "up.pid").exists():
            out.cli("down", "--force", timeout=120)
        for pgid in pids:  # never leave an engine behind, whatever failed
            if _our_group(pgid, vllm_venv):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)


def _kv_tokens(log: str) -> int:
    found = KV_TOKENS.findall(log)
    assert found, log[-3000:]
    return int(found[-1].replace(",", ""))


def _complete(url: str, model: str) -> str:
    body = {"model": model, "prompt": "hello world", "max_tokens": 8, "temperature": 0}
    reply = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return str(reply.json()["choices"][0]["text"])


def _chat(client: httpx.Client, model: str) -> httpx.Response:
    return client.post("/v1/chat/completions", json={
        "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})


def test_the_kv_cache_gives_up_the_computed_reservation(
    fleet: Fleet, tiny_models: dict[str, Path]
) -> None:
    plain_tokens = _kv_tokens(fleet.plain.log_text())
    lora_tokens = _kv_tokens(fleet.log.read_text(errors="replace"))
    profile = load_profile(tiny_models["tiny-llama"])
    per_token = 2 * profile.num_layers * profile.num_kv_heads * profile.head_dim * 2  # K+V bf16
    measured = (plain_tokens - lora_tokens) * per_token
    expected = reservation_bytes(wrapped_modules(profile, 1), SLOTS, 2)
    assert abs(measured - expected) / expected <= 0.05, (measured, expected)
    [inst] = fleet.instances()
    plain_text = _complete(fleet.plain.url, BASE)
    assert _complete(inst["url"], BASE) == plain_text  # the base is unchanged
    assert _complete(inst["url"], ADAPTER) != plain_text  # the adapter is applied


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
