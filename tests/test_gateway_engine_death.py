"""A stream cut by engine death (issue 23 item 3). Real vLLM 0.32 answers HTTP 200, then,
when its engine core dies, ends the stream with `data: {"error": {...InternalServerError,
"code": 500}}` and `data: [DONE]`, turns /health 503 and exits 0. The simulator does the
same on its `die_after_tokens` fault; the gateway relays one OpenAI-shaped error event,
ends with `[DONE]`, and counts the request as failed (status, replica failure, billing)."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest
from test_gateway_fakes import Harness, harness, http  # noqa: F401

from inferplane.gateway import GatewayConfig, ModelRoute
from inferplane.gateway.stream_errors import InbandError
from inferplane.sim.config import FaultConfig, SimEngineConfig
from inferplane.sim.host import EngineHandle, start_engine
from inferplane.sim.protocol import ENGINE_DEAD_MESSAGE

STREAM = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
          "max_tokens": 40, "ignore_eos": True}


def _events(body: bytes) -> list[bytes]:
    return [e for e in body.split(b"\n\n") if e]


def _metric(url: str, prefix: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in http.get(url + "/metrics").text
               .splitlines() if line.startswith(prefix))


def _wait_for(condition, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def _dying_sim(harness: Harness, tokens: int) -> EngineHandle:  # noqa: F811
    config = SimEngineConfig(model="m", faults=FaultConfig(die_after_tokens=tokens))
    return harness.run(start_engine(config))


def test_the_simulator_dies_mid_stream_as_vllm_does(harness: Harness) -> None:  # noqa: F811
    sim = _dying_sim(harness, 3)
    try:
        with http.stream("POST", sim.url + "/v1/chat/completions", json=STREAM) as r:
            assert r.status_code == 200  # sent before the engine core died
            events = _events(r.read())
        assert events[-1] == b"data: [DONE]"
        error = orjson.loads(events[-2].removeprefix(b"data: "))
        assert error == {"error": {"message": ENGINE_DEAD_MESSAGE,
                                   "type": "InternalServerError", "param": None, "code": 500}}
        tokens = [e for e in events[:-2] if b'"content":"' in e and b'"role"' not in e]
        assert len(tokens) == 3
        assert sim.died.is_set()
        assert http.get(sim.url + "/health").status_code == 503
        after = http.post(sim.url + "/v1/chat/completions", json={**STREAM, "stream": False})
        assert after.status_code == 500 and after.json()["error"]["message"] == ENGINE_DEAD_MESSAGE
    finally:
        harness.run(sim.stop())


def test_the_gateway_relays_the_engines_error_event_and_counts_a_failure(
    harness: Harness, tmp_path: Path,  # noqa: F811
) -> None:
    sim = _dying_sim(harness, 4)
    log = tmp_path / "access.log"
    config = GatewayConfig(models=(ModelRoute("m", endpoints=(sim.url,)),),
                           access_log_path=str(log), health_interval_s=0.05)
    app, url = harness.gateway(config)
    try:
        headers = {"x-request-id": "dies"}
        with http.stream("POST", url + "/v1/chat/completions", json=STREAM,
                         headers=headers) as r:
            assert r.status_code == 200
            events = _events(r.read())
        assert events[-1] == b"data: [DONE]"
        errors = [e for e in events if e.startswith(b'data: {"error"')]
        assert len(errors) == 1  # the engine's own, not a second one from the gateway
        assert orjson.loads(errors[0].removeprefix(b"data: "))["error"]["code"] == 500
        _wait_for(lambda: log.exists() and b"dies" in log.read_bytes())
        line = orjson.loads(log.read_bytes().splitlines()[0])
        assert line["status"] == 500
        assert line["completion_tokens"] == 4  # the token events streamed, not the error
        assert line["prompt_tokens"] > 0
        assert _metric(url, 'inferplane_requests_total{model="m"') == 1
        assert _metric(url, 'inferplane_requests_total{model="m",replica="') == 1
        assert 'status="500"' in http.get(url + "/metrics").text
        [backend] = app.state.backends("m")
        assert backend.consecutive_failures == 1  # the replica's failure, not a clean 200
    finally:
        harness.run(sim.stop())


def test_an_error_event_then_a_dropped_connection_gets_one_error_and_done(
    harness: Harness,  # noqa: F811
) -> None:
    engine = harness.engine("m")
    error = (b'data: {"error": {"message": "EngineCore encountered an issue.", '
             b'"type": "InternalServerError", "param": null, "code": 500}}\n\n')
    # a token, the error event split across two writes, then the process is gone
    engine.stream_bytes = lambda raw, model, usage: [  # type: ignore[method-assign]
        engine.chunk(raw, model, 0), error[:9], error[9:], b"data: [DONE]\n\n"]
    engine.die_after_chunks = 3
    _, url = harness.gateway(GatewayConfig(models=(ModelRoute("m", endpoints=(engine.url,)),),
                                           access_log=False))
    with http.stream("POST", url + "/v1/chat/completions", json=STREAM) as r:
        assert r.status_code == 200
        events = _events(r.read())
    assert [e for e in events if b'"error"' in e] == [error.strip()]
    assert events[-1] == b"data: [DONE]"


def test_inband_error_scanner() -> None:
    scan = InbandError()
    scan.feed(b'data: {"choices":[{"delta":{"content":"data: {\\"error\\""}}]}\n\n')
    assert not scan.seen  # inside a JSON string the quote is escaped: text, not an event
    scan.feed(b'data: {"err')
    scan.feed(b'or": {"message": "gone", "code": 503}}')
    assert scan.seen and scan.status is None
    scan.feed(b"\n\ndata: [DONE]\n\n")
    assert (scan.status, scan.message) == (503, "gone")
    cut = InbandError()
    cut.feed(b'data: {"error": {"mess')
    cut.finish()
    assert cut.status == 500  # unparseable: still a failure


def test_inband_error_scanner_finds_the_event_across_any_split() -> None:
    stream = (b'data: {"choices":[]}\n\n' + b'data: {"error": {"message": "gone", '
              b'"code": 503}}\n\n' + b"data: [DONE]\n\n")  # fmt: skip
    for size in (1, 2, 5, 13, 14, 15, 40):
        for start in range(size):
            scan = InbandError()
            pieces = [stream[:start], *(stream[i:i + size]
                                        for i in range(start, len(stream), size))]  # fmt: skip
            started = [scan.feed(piece) for piece in pieces]
            assert started.count(True) == 1, (size, start)
            assert (scan.status, scan.message) == (503, "gone"), (size, start)


@pytest.mark.parametrize("command", [
    ["-m", "inferplane", "sim", "--model", "m"],  # `inferplane sim`
    ["-m", "inferplane.sim.fake_vllm", "serve", "m"],  # the fake `vllm serve` binary
])  # fmt: skip
def test_the_sim_exits_0_after_its_engine_core_died(command: list[str]) -> None:
    import subprocess
    import sys

    from inferplane.runtime.instances import free_port

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, *command, "--port", str(port), "--die-after-tokens", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_for(lambda: _answers(url + "/health"), timeout=60)
        with http.stream("POST", url + "/v1/chat/completions", json=STREAM) as r:
            assert r.status_code == 200
            assert b'"InternalServerError"' in r.read()
        assert proc.wait(timeout=30) == 0  # as vLLM: exit 0, which `up` counts as a crash
        assert proc.stdout is not None and b"engine death" in proc.stdout.read()
    finally:
        proc.kill()
        proc.wait()


def _answers(url: str) -> bool:
    try:
        return http.get(url).status_code == 200
    except Exception:
        return False
