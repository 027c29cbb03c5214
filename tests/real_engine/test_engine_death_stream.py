"""Real vLLM's way of dying mid-stream, held against what the simulator's `die_after_tokens`
fault does (and the gateway's tests rely on): a kill -9 of the EngineCore while a stream
runs ends that stream (HTTP 200 already sent) with vLLM's error event and `data: [DONE]`,
/health turns 503, and the API server exits with code 0."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import httpx
import orjson
from real_vllm import RealEngine, start_vllm

from inferplane.gateway.stream_errors import InbandError
from inferplane.sim.protocol import engine_dead

ENGINE_CORE_PID = re.compile(r"\(EngineCore(?:_DP\d+)? pid=(\d+)\)")


def test_engine_core_death_mid_stream_matches_the_simulator(
    vllm_venv: Path, tiny_models: dict[str, Path], real_vllm: list[RealEngine], tmp_path: Path
) -> None:
    engine = start_vllm(vllm_venv, tiny_models["tiny-llama"], "tiny-llama", tmp_path,
                        cores="0")  # fmt: skip
    real_vllm.append(engine)
    pids = {int(p) for p in ENGINE_CORE_PID.findall(engine.log_text())}
    assert pids, engine.log_text()[-2000:]
    body = {"model": "tiny-llama", "stream": True, "max_tokens": 500, "ignore_eos": True,
            "messages": [{"role": "user", "content": "hello"}]}
    chunks: list[bytes] = []
    with httpx.stream("POST", engine.url + "/v1/chat/completions", json=body,
                      timeout=120) as reply:  # fmt: skip
        assert reply.status_code == 200
        for n, chunk in enumerate(reply.iter_raw()):
            chunks.append(chunk)
            if n == 2:
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)  # the engine core dies mid-stream
    events = [e for e in b"".join(chunks).split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    error = orjson.loads(events[-2].removeprefix(b"data: "))
    assert error == engine_dead().body()  # the simulator's event, key for key and value
    scan = InbandError()
    scan.feed(b"".join(chunks))
    assert scan.status == 500  # what the gateway counts the request as
    deadline = time.monotonic() + 60
    health = None
    while time.monotonic() < deadline and engine.process.poll() is None:
        try:
            health = httpx.get(engine.url + "/health", timeout=2).status_code
        except httpx.HTTPError:
            break
        if health == 503:
            break
        time.sleep(0.2)
    assert health in (503, None)  # 503 while it winds down (gone already: None)
    assert engine.process.wait(timeout=60) == 0  # vLLM exits 0 once its engine died
