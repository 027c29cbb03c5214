"""Operating a running fleet from another shell: tenancy in `up`, `logs`, `restart`,
`status` live figures, the forced second Ctrl-C. Real processes on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from sqlalchemy import select

from inferplane.runtime import Runtime, RuntimeOptions, Supervised
from inferplane.runtime.channel import call, control_file
from inferplane.runtime.engine_stats import parse_engine_stats
from inferplane.runtime.process import RotatingLog
from inferplane.runtime.state import StateDir
from inferplane.spec import load_fleet
from inferplane.store import Store, UsageRow
from inferplane.tenancy.keys import create_key

FLEET = """\
engine: sim
models:
  - name: chat
    source: Qwen/Qwen3-0.6B
    max_model_len: 4096
"""
CLI = [sys.executable, "-m", "inferplane"]


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}  # rich tables: no folded cells
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def _chat_body(max_tokens: int = 4) -> dict[str, object]:
    return {"model": "chat", "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture
def fleet_file(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    return path


@pytest.fixture
def detached(tmp_path: Path, fleet_file: Path) -> Iterator[tuple[Path, dict[str, object]]]:
    """A fleet started with `up --detach`; stopped with `down` afterwards."""
    state_dir = tmp_path / "state"
    done = _cli("up", str(fleet_file), "--detach", "--state-dir", str(state_dir),
                "--gateway-port", "0", "--grace-period-s", "20")
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads((state_dir / "state.json").read_text())
    try:
        yield state_dir, data
    finally:
        pid = StateDir(state_dir).running_pid()
        if pid is not None:
            _cli("down", "--state-dir", str(state_dir), "--force")


def _usage_rows(url: str) -> list[UsageRow]:
    async def read() -> list[UsageRow]:
        store = await Store.open(url)
        try:
            async with store.session() as session:
                return list((await session.scalars(select(UsageRow))).all())
        finally:
            await store.close()

    return asyncio.run(read())


def test_up_enforces_keys_and_ledgers_usage_until_down(tmp_path: Path, fleet_file: Path) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    url = f"sqlite:///{state_dir / 'inferplane.db'}"  # up's default database

    async def make_key() -> tuple[str, str]:
        store = await Store.open(url)
        try:
            row, secret = await create_key(store, "team-a")
            return row.id, secret
        finally:
            await store.close()

    key_id, secret = asyncio.run(make_key())
    done = _cli("up", str(fleet_file), "--detach", "--state-dir", str(state_dir),
                "--gateway-port", "0")
    assert done.returncode == 0, done.stdout + done.stderr
    try:
        status = json.loads((state_dir / "state.json").read_text())
        assert status["tenancy"]["auth_required"] is True
        assert status["tenancy"]["database"].endswith(str(state_dir / "inferplane.db"))
        gw = status["gateway"]["url"]
        anonymous = httpx.post(gw + "/v1/chat/completions", json=_chat_body(), timeout=30)
        assert anonymous.status_code == 401
        assert anonymous.json()["error"]["code"] == "invalid_api_key"
        ok = httpx.post(gw + "/v1/chat/completions", json=_chat_body(),
                        headers={"Authorization": f"Bearer {secret}"}, timeout=30)
        assert ok.status_code == 200, ok.text
        completion = ok.json()["usage"]["completion_tokens"]
    finally:
        down = _cli("down", "--state-dir", str(state_dir))
    assert down.returncode == 0, down.stdout + down.stderr
    rows = [r for r in _usage_rows(url) if r.status == 200]
    assert len(rows) == 1
    assert rows[0].key_id == key_id and rows[0].model == "chat"
    assert rows[0].completion_tokens == completion > 0


def test_up_without_tenancy_admits_anyone(tmp_path: Path, fleet_file: Path) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    done = _cli("up", str(fleet_file), "--detach", "--state-dir", str(state_dir),
                "--gateway-port", "0", "--no-tenancy", "--db", "sqlite:///" + str(tmp_path / "x"))
    assert done.returncode == 0, done.stdout + done.stderr
    pid = StateDir(state_dir).running_pid()
    assert pid is not None
    try:
        status = json.loads((state_dir / "state.json").read_text())
        assert status["tenancy"] is None
        resp = httpx.post(status["gateway"]["url"] + "/v1/chat/completions",
                          json=_chat_body(), timeout=30)
        assert resp.status_code == 200
    finally:
        down = _cli("down", "--state-dir", str(state_dir))
    assert down.returncode == 0 and f"fleet stopped (pid {pid})" in down.stdout, down.stderr
    # "stopped" means the `up` process is gone, not only its state file
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not (state_dir / "inferplane.db").exists() and not (tmp_path / "x").exists()


def test_restart_logs_and_status_from_another_shell(
    detached: tuple[Path, dict[str, object]],
) -> None:
    state_dir, data = detached
    gw = data["gateway"]["url"]  # type: ignore[index]
    instances: list[dict[str, Any]] = data["instances"]  # type: ignore[assignment]
    [before] = instances
    info_path = control_file(StateDir(state_dir))
    assert stat.S_IMODE(info_path.stat().st_mode) == 0o600

    # status: live figures from the engine's /metrics, uptime.
    shown = _cli("status", "--state-dir", str(state_dir), "--json")
    assert shown.returncode == 0, shown.stderr
    live = json.loads(shown.stdout)
    [inst] = live["instances"]
    assert inst["name"] == "chat-0" and inst["state"] == "ready"  # existing schema kept
    assert inst["waiting"] == 0 and inst["running"] == 0
    assert inst["kv_cache_usage"] is not None and 0 <= inst["kv_cache_usage"] <= 1
    assert inst["uptime_s"] >= 0 and live["uptime_s"] >= inst["uptime_s"]
    table = _cli("status", "--state-dir", str(state_dir))
    assert table.returncode == 0 and "kv cache" in table.stdout and "chat-0" in table.stdout

    # restart: while it runs, the gateway answers 503 itself, never a failed proxy.
    seen: list[int] = []
    stop = threading.Event()

    def poll() -> None:
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                seen.append(client.post(gw + "/v1/chat/completions",
                                        json=_chat_body(1)).status_code)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        done = _cli("restart", "chat-0", "--state-dir", str(state_dir))
    finally:
        stop.set()
        poller.join()
    assert done.returncode == 0, done.stdout + done.stderr
    after = json.loads((state_dir / "state.json").read_text())["instances"][0]
    assert after["state"] == "ready" and after["restarts"] == 1
    assert after["pid"] != before["pid"] and not psutil.pid_exists(before["pid"])
    assert 503 in seen and set(seen) <= {200, 503}
    resp = httpx.post(gw + "/v1/chat/completions", json=_chat_body(), timeout=30)
    assert resp.status_code == 200

    # logs: the last lines, including the restart.
    shown = _cli("logs", "chat-0", "--state-dir", str(state_dir), "--lines", "1000")
    assert shown.returncode == 0
    assert shown.stdout.startswith("--- starting")
    assert "--- restarting: restart requested" in shown.stdout
    assert shown.stdout.count("--- starting") == 2
    last = _cli("logs", "chat-0", "--state-dir", str(state_dir), "-n", "2").stdout
    assert last.splitlines() == shown.stdout.splitlines()[-2:]

    # user errors: exit 2 with what exists.
    unknown = _cli("restart", "nope-0", "--state-dir", str(state_dir))
    assert unknown.returncode == 2 and "chat-0" in unknown.stderr
    no_log = _cli("logs", "nope-0", "--state-dir", str(state_dir))
    assert no_log.returncode == 2 and "chat-0" in no_log.stderr

    # the channel wants the token.
    info = json.loads(info_path.read_text())
    import socket

    with socket.create_connection((info["host"], info["port"]), 10) as sock:
        sock.sendall(json.dumps({"op": "restart", "instance": "chat-0",
                                 "token": "guess"}).encode() + b"\n")
        reply = json.loads(sock.makefile().readline())
    assert reply == {"ok": False, "error": "wrong or missing token"}
    assert json.loads((state_dir / "state.json").read_text())["instances"][0]["restarts"] == 1

    assert _cli("down", "--state-dir", str(state_dir)).returncode == 0
    assert not info_path.exists()
    stopped = json.loads(_cli("status", "--state-dir", str(state_dir), "--json").stdout)
    assert stopped["uptime_s"] is None
    assert stopped["instances"][0]["waiting"] is None
    assert stopped["instances"][0]["uptime_s"] is None
    again = _cli("restart", "chat-0", "--state-dir", str(state_dir))
    assert again.returncode == 2 and "no running fleet" in again.stderr


def test_logs_follow_across_rotation(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    log = RotatingLog(state_dir / "logs" / "chat-0.log", max_bytes=400, backups=2)
    log.write("old line\n")
    follower = subprocess.Popen(
        [*CLI, "logs", "chat-0", "-f", "--lines", "1", "--state-dir", str(state_dir)],
        stdout=subprocess.PIPE, text=True,
    )
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.extend(iter(follower.stdout.readline, "")))  # type: ignore[union-attr]
    reader.start()
    try:
        expected = ["old line"]
        deadline = time.monotonic() + 60
        while not got and time.monotonic() < deadline:  # the follower has started
            time.sleep(0.05)
        for batch in range(6):  # each batch overflows 400 bytes: one rotation per batch
            lines = [f"batch {batch} line {i:02d} " + "x" * 20 for i in range(12)]
            for line in lines:
                log.write(line + "\n")
            expected += lines
            deadline = time.monotonic() + 20
            while len(got) < len(expected) and time.monotonic() < deadline:
                time.sleep(0.05)
        assert (state_dir / "logs" / "chat-0.log.2").exists()  # it did rotate
        assert [line.rstrip("\n") for line in got] == expected
    finally:
        follower.send_signal(signal.SIGINT)
        assert follower.wait(10) == 0
        reader.join()
        log.close()


def test_second_sigint_during_drain_kills_engines_at_once(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET.replace("max_model_len: 4096", "max_model_len: 4096\n    replicas: 2"))
    state_dir = tmp_path / "state"
    up = subprocess.Popen(
        [*CLI, "up", str(fleet), "--state-dir", str(state_dir), "--gateway-port", "0",
         "--grace-period-s", "600"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    state_file = state_dir / "state.json"

    def phase() -> str | None:
        try:
            return str(json.loads(state_file.read_text())["phase"])
        except (OSError, ValueError):
            return None

    try:
        deadline = time.monotonic() + 60
        while phase() != "running" and time.monotonic() < deadline:
            assert up.poll() is None, up.stdout.read() if up.stdout else ""
            time.sleep(0.05)
        state = json.loads(state_file.read_text())
        url = state["gateway"]["url"]
        tree = psutil.Process(up.pid).children(recursive=True)
        engines = {i["pid"] for i in state["instances"]}
        assert engines <= {p.pid for p in tree} and len(engines) == 2

        results: list[str] = []
        started = threading.Event()  # every stream has its first chunk
        lock = threading.Lock()
        first: list[int] = []

        def stream() -> None:
            body = {**_chat_body(100_000), "stream": True, "ignore_eos": True,
                    "max_tokens": 3000}
            text = ""
            try:
                with httpx.stream("POST", url + "/v1/chat/completions", json=body,
                                  timeout=120) as resp:
                    for chunk in resp.iter_text():
                        if not text:
                            with lock:
                                first.append(1)
                                if len(first) == 4:
                                    started.set()
                        text += chunk
            except httpx.HTTPError as exc:
                text += f"\n[cut: {type(exc).__name__}]"
            results.append(text)

        streams = [threading.Thread(target=stream) for _ in range(4)]
        for t in streams:
            t.start()
        assert started.wait(30)
        up.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 20
        while phase() != "draining" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert phase() == "draining"
        assert any(p.is_running() for p in tree)  # draining: the long streams still run
        up.send_signal(signal.SIGINT)
        assert up.wait(60) == 130
        for t in streams:
            t.join(60)
        # The streams were cut, not finished: the grace period (600 s) was not waited for.
        assert len(results) == 4
        assert all("failed mid-stream" in r or "[cut:" in r for r in results), results
        assert not any('"finish_reason":"length"' in r.replace(" ", "") for r in results)
        alive = [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert alive == []
        assert phase() == "stopped" and not (state_dir / "up.pid").exists()
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


def test_engine_stats_parse_current_and_old_names() -> None:
    text = (
        '# HELP vllm:num_requests_waiting x\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_waiting{engine="1",model_name="m"} 2.0\n'
        'vllm:num_requests_running{engine="0",model_name="m"} 7.0\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5\n'
    )
    stats = parse_engine_stats(text)
    assert (stats.waiting, stats.running, stats.kv_cache_usage) == (5.0, 7.0, 0.5)
    old = parse_engine_stats('vllm:gpu_cache_usage_perc{model_name="m"} 0.75\n')
    assert (old.waiting, old.running, old.kv_cache_usage) == (None, None, 0.75)
    assert parse_engine_stats("garbage\nvllm:num_requests_running nan-ish\n").running is None


async def test_restart_over_the_channel_in_process(
    tmp_path: Path, fleet_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from inferplane.runtime import SupervisorSettings

    # pytest's command line does not name inferplane: the pid check would not know us.
    monkeypatch.setattr(StateDir, "running_pid", lambda self: os.getpid())

    settings = SupervisorSettings(probe_interval_s=0.2, probe_timeout_s=0.5,
                                  backoff_initial_s=0.1, startup_deadline_s=30)
    rt = Runtime(load_fleet(fleet_file),
                 RuntimeOptions(state_dir=tmp_path / "s", gateway_port=0, settings=settings,
                                tenancy=False))
    await rt.start()
    try:
        assert await rt.wait_settled(30)
        rec = rt.supervisor.records["chat-0"]
        states: list[str] = []
        def record(r: Supervised) -> None:
            states.append(r.state)
            rt._on_change(r)

        rt.supervisor._on_change = record
        state = StateDir(tmp_path / "s")
        reply = await asyncio.to_thread(
            call, state, {"op": "restart", "instance": "chat-0", "wait_s": 30}, 40
        )
        assert reply["ok"] and reply["instance"]["state"] == "ready"
        assert states[0] == "unhealthy" and states[-1] == "ready" and rec.restarts == 1
        ping = await asyncio.to_thread(call, state, {"op": "ping"}, 5)
        assert ping == {"ok": True, "pid": os.getpid()}
    finally:
        await rt.drain_and_stop()
