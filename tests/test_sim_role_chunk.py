"""The simulator's chat stream opens with its role chunks when the first token exists, as
vLLM's does (`chat_completion_stream_generator` sends them on the first engine output), not
before prefill: a client's or the gateway's time to the first chunk is then the time to the
first token (found as `inferplane trace` showing "TTFT 0.002 s" for a stream)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from inferplane.sim.config import SimEngineConfig
from inferplane.sim.generate import Generation
from inferplane.sim.host import EngineHost


def _stream(url: str, **body: Any) -> list[str]:
    lines: list[str] = []
    payload = {"model": "sim-chat", "stream": True, "max_tokens": 3,
               "messages": [{"role": "user", "content": "word " * 200}], **body}  # fmt: skip
    with httpx.stream("POST", url + "/v1/chat/completions", json=payload, timeout=30) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data:")]
    return lines


def test_role_chunks_follow_the_first_token(monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[str] = []
    events, stream = Generation._events, Generation.stream

    async def spy_events(self: Generation) -> AsyncIterator[Any]:
        async for item in events(self):
            order.append("token")
            yield item

    async def spy_stream(self: Generation) -> AsyncIterator[bytes]:
        async for chunk in stream(self):
            order.append("role chunk" if b'"role"' in chunk else "chunk")
            yield chunk

    monkeypatch.setattr(Generation, "_events", spy_events)
    monkeypatch.setattr(Generation, "stream", spy_stream)
    with EngineHost([SimEngineConfig(model="sim-chat", max_model_len=2048)]) as (engine,):
        lines = _stream(engine.url, n=2)
    assert order.index("token") < order.index("role chunk")
    assert order[:3] == ["token", "role chunk", "role chunk"]  # one per choice, then content
    assert '"role":"assistant"' in lines[0].replace(" ", "") and lines[-1] == "data: [DONE]"
    assert sum('"role"' in line for line in lines) == 2
