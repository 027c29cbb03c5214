"""From the fleet file to a running gateway: the adapter and `inferplane gateway`."""

from __future__ import annotations

import json
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

from inferplane.errors import InferplaneError
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
    routing:
      policy: prefix_affinity
      max_queue_depth: 4
      max_queue_wait_s: 2.5
      long_prompt: {threshold_tokens: 8000, model: chat-long}
      retries: 0
      eject_after_failures: 5
    max_tokens_cap: {limit: 512, action: reject}
    timeouts: {first_byte_s: 30}
  - name: chat-canary
    endpoints: ["http://127.0.0.1:9002"]
  - name: chat-long
    endpoints: ["http://127.0.0.1:9003"]
    served_model_name: llama-3-8b
routes:
  - model: chat
    backends: [{target: chat, weight: 95}, {target: chat-canary, weight: 5}]
gateway:
  port: 8088
  max_body_mib: 1
  timeouts: {idle_s: 45}
  priority_header: X-Job-Class
  access_log_path: /var/log/inferplane/access.jsonl
"""


def test_fleet_file_becomes_gateway_config(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    config = gateway_config_from_fleet(load_fleet(path))
    chat, canary, long = config.models
    assert chat.endpoints == ("http://127.0.0.1:9001",)
    assert chat.upstream_name == "llama-3-8b" and chat.aliases == ("default",)
    assert chat.scorers == ("prefix_affinity", "least_outstanding")
    assert chat.max_concurrency_per_replica == 8
    assert (chat.max_tokens_cap, chat.max_tokens_mode) == (512, "reject")
    assert chat.timeouts.first_token_s == 30 and chat.timeouts.idle_s == 45  # model, then gateway
    assert chat.admission.max_queue_depth == 4 and chat.admission.max_queue_wait_s == 2.5
    assert canary.upstream_name == "chat-canary" and canary.max_concurrency_per_replica == 256
    assert (config.port, config.max_body_bytes) == (8088, 2**20)
    assert chat.long_prompt_lane == LongPromptLane(8000, "chat-long")
    assert (chat.retries, chat.eject_after_failures) == (0, 5)
    assert (config.priority_header, config.access_log_path) == (
        "X-Job-Class",
        "/var/log/inferplane/access.jsonl",
    )
    # Unset, they keep the gateway's defaults.
    dflt_model = ModelRoute("x")
    assert canary.long_prompt_lane is None and long.long_prompt_lane is None
    assert (canary.retries, canary.eject_after_failures) == (
        dflt_model.retries,
        dflt_model.eject_after_failures,
    )
    state = GatewayState(config)
    # The route splits the model's own name and its aliases alike.
    for name in ("chat", "default"):
        picks = Counter(state.resolve(name).route.name for _ in range(1000))  # type: ignore[union-attr]
        assert picks == {"chat": 950, "chat-canary": 50}
    assert state.resolve("chat-canary").route.name == "chat-canary"  # type: ignore[union-attr]


def test_fleet_gateway_defaults_match_the_gateway_config(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("models:\n  - name: m\n    endpoints: ['http://127.0.0.1:9001']\n")
    config = gateway_config_from_fleet(load_fleet(path))
    (route,) = config.models
    defaults, dflt_model = GatewayConfig(), ModelRoute("m")
    assert config.priority_header.lower() == defaults.priority_header
    assert config.access_log_path is None
    assert config.port == defaults.port == 8000
    assert route.timeouts == dflt_model.timeouts  # one source for every timeout default
    assert route.long_prompt_lane is None
    assert (
        (route.retries, route.eject_after_failures)
        == (2, 3)
        == (
            dflt_model.retries,
            dflt_model.eject_after_failures,
        )
    )


@pytest.mark.parametrize(
    ("routing", "needle"),
    [
        ("{retries: '2'}", "retries"),
        ("{retries: -1}", "retries"),
        ("{eject_after_failures: 0}", "eject_after_failures"),
        ("{long_prompt: {threshold_tokens: 0, model: m}}", "threshold_tokens"),
        ("{long_prompt: {threshold_tokens: 100}}", "model"),
        ("{long_prompt: {threshold_tokens: 100, model: m, pool: x}}", "pool"),
    ],
)
def test_new_routing_fields_are_strict(tmp_path: Path, routing: str, needle: str) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(
        f"models:\n  - name: m\n    endpoints: ['http://127.0.0.1:9001']\n    routing: {routing}\n"
    )
    with pytest.raises(InferplaneError) as info:
        load_fleet(path)
    assert needle in str(info.value)


@pytest.mark.parametrize(
    ("gateway", "needle"),
    [("{priority_header: ''}", "priority_header"), ("{access_log_path: 3}", "access_log_path")],
)
def test_new_gateway_fields_are_strict(tmp_path: Path, gateway: str, needle: str) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(
        f"models:\n  - name: m\n    endpoints: ['http://127.0.0.1:9001']\ngateway: {gateway}\n"
    )
    with pytest.raises(InferplaneError) as info:
        load_fleet(path)
    assert needle in str(info.value)


def test_long_prompt_lane_to_an_unknown_model_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "models:\n  - name: m\n    endpoints: ['http://127.0.0.1:9001']\n"
        "    routing: {long_prompt: {threshold_tokens: 100, model: nope}}\n"
    )
    with pytest.raises(InferplaneError) as info:
        gateway_config_from_fleet(load_fleet(path))
    assert info.value.field == "models.m.long_prompt_lane.model"


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
        cwd=tmp_path,  # the default usage database is ./.inferplane/: not the repo's
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


def test_cli_access_log_path_writes_one_json_line_per_request(
    harness: Harness,  # noqa: F811
    tmp_path: Path,
) -> None:
    engine = harness.engine("tiny")
    log = tmp_path / "logs" / "access.jsonl"
    log.parent.mkdir()
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "inferplane", "gateway", "--backend", f"tiny={engine.url}",
         "--host", "127.0.0.1", "--port", str(port), "--no-tenancy",
         "--access-log-path", str(log)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(400):
            try:
                if http.get(url + "/ready").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None
            time.sleep(0.05)
        for rid in ("req-1", "req-2"):
            response = http.post(
                url + "/v1/completions",
                json={"model": "tiny", "prompt": "hello"},
                headers={"X-Request-ID": rid},
            )
            assert response.status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=10)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(line["request_id"], line["model"], line["status"]) for line in lines] == [
        ("req-1", "tiny", 200),
        ("req-2", "tiny", 200),
    ]
    assert b'"req-1"' not in stderr  # the file, not stderr


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
