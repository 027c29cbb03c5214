"""From the fleet file to a running gateway: the adapter and `inferplane gateway`."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from test_gateway_fakes import Harness, harness, http  # noqa: F401

from inferplane.gateway import GatewayConfig, LongPromptLane, ModelRoute
from inferplane.gateway.fleet import gateway_config_from_fleet
from inferplane.gateway.state import GatewayState
from inferplane.spec import load_fleet

FLEET = """\
models:
  - name: chat
    endpoints: ["http://127.0.0.1:9001"]
    served_model_name: llama-3-8b
    aliases: [default]
    max_num_seqs: 8
    routing: {policy: prefix_affinity, max_queue_depth: 4, max_queue_wait_s: 2.5}
    max_tokens_cap: {limit: 512, action: reject}
    timeouts: {first_byte_s: 30}
  - name: chat-canary
    endpoints: ["http://127.0.0.1:9002"]
routes:
  - model: chat
    backends: [{target: chat, weight: 95}, {target: chat-canary, weight: 5}]
gateway:
  port: 8088
  max_body_mib: 1
  timeouts: {idle_s: 45}
"""


def test_fleet_file_becomes_gateway_config(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    config = gateway_config_from_fleet(load_fleet(path))
    chat, canary = config.models
    assert chat.endpoints == ("http://127.0.0.1:9001",)
    assert chat.upstream_name == "llama-3-8b" and chat.aliases == ("default",)
    assert chat.scorers == ("prefix_affinity", "least_outstanding")
    assert chat.max_concurrency_per_replica == 8
    assert (chat.max_tokens_cap, chat.max_tokens_mode) == (512, "reject")
    assert chat.timeouts.first_token_s == 30 and chat.timeouts.idle_s == 45  # model, then gateway
    assert chat.admission.max_queue_depth == 4 and chat.admission.max_queue_wait_s == 2.5
    assert canary.upstream_name == "chat-canary" and canary.max_concurrency_per_replica == 256
    assert (config.port, config.max_body_bytes) == (8088, 2**20)
    state = GatewayState(config)
    # The route splits the model's own name and its aliases alike.
    for name in ("chat", "default"):
        picks = Counter(state.resolve(name).route.name for _ in range(1000))  # type: ignore[union-attr]
        assert picks == {"chat": 950, "chat-canary": 50}
    assert state.resolve("chat-canary").route.name == "chat-canary"  # type: ignore[union-attr]


def test_long_prompts_go_to_their_own_lane(harness: Harness) -> None:  # noqa: F811
    short, long = harness.engine("m"), harness.engine("m")
    config = GatewayConfig(
        models=(
            ModelRoute("m", endpoints=(short.url,), long_prompt_lane=LongPromptLane(500, "m-long")),
            ModelRoute("m-long", endpoints=(long.url,), served_name="m"),
        ),
        access_log=False,
    )
    _, url = harness.gateway(config)
    small = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    big = {"model": "m", "messages": [{"role": "user", "content": "x" * 4000}]}
    assert http.post(url + "/v1/chat/completions", json=small).status_code == 200
    assert http.post(url + "/v1/chat/completions", json=big).status_code == 200
    assert len(short.requests) == 1 and len(long.requests) == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_cli_serves_a_fleet_with_one_endpoint(harness: Harness, tmp_path: Path) -> None:  # noqa: F811
    engine = harness.engine("tiny")
    path = tmp_path / "fleet.yaml"
    path.write_text(f"models:\n  - name: tiny\n    endpoints: [{engine.url!r}]\n")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "inferplane", "gateway", "--fleet", str(path),
         "--host", "127.0.0.1", "--port", str(port), "--no-access-log"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                if http.get(url + "/ready").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        body = {"model": "tiny", "prompt": "hello"}
        assert http.post(url + "/v1/completions", json=body).status_code == 200
        assert [m["id"] for m in http.get(url + "/v1/models").json()["data"]] == ["tiny"]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(10)


@pytest.mark.parametrize(
    ("args", "needle"),
    [([], "--fleet"), (["--backend", "nourl"], "MODEL=URL")],
)
def test_cli_errors_exit_2_with_a_fix(args: list[str], needle: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "inferplane", "gateway", *args],
        capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"},
    )  # fmt: skip
    assert proc.returncode == 2
    assert needle in proc.stderr and "Fix:" in proc.stderr
