"""One streamed request, timed the way `vllm bench serve` times it.

TTFT: request sent -> first chunk carrying text. ITL: the gap between consecutive
chunks carrying text (per chunk, so a chunk of several tokens is one gap). E2EL: request
sent -> last chunk with text. Output tokens: the server's `usage.completion_tokens`
(`stream_options.include_usage`), else the chunks counted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from inferplane.bench.datasets import BenchRequest

if TYPE_CHECKING:
    import aiohttp


@dataclass
class RequestResult:
    model: str
    prompt_tokens: int
    output_tokens: int = 0
    success: bool = False
    error: str = ""
    start_s: float = 0.0  # perf_counter when sent
    ttft_s: float = 0.0
    latency_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    server_usage: bool = False  # token counts came from the server

    @property
    def tpot_s(self) -> float:
        """(E2EL - TTFT) / (output tokens - 1); 0 for one-token outputs (vLLM)."""
        if self.output_tokens <= 1:
            return 0.0
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)


def request_body(request: BenchRequest, model: str, api: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": request.output_tokens,
        "ignore_eos": True,  # exact output lengths, as vllm bench serve does
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if api == "chat":
        body["messages"] = [{"role": "user", "content": request.prompt}]
    else:
        body["prompt"] = request.prompt
    return body


def _chunk_text(event: dict[str, Any]) -> str | None:
    choices = event.get("choices")
    if not choices:
        return None
    choice = choices[0]
    if "text" in choice:
        return str(choice.get("text") or "")
    delta = choice.get("delta") or {}
    content = delta.get("content") or delta.get("reasoning_content") or ""
    return str(content)


async def send(
    session: aiohttp.ClientSession,
    base_url: str,
    request: BenchRequest,
    model: str,
    *,
    api: str = "completions",
    headers: dict[str, str] | None = None,
) -> RequestResult:
    """POST one streamed request; never raises for HTTP or stream errors."""
    import aiohttp

    path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
    result = RequestResult(model=model, prompt_tokens=request.prompt_tokens)
    chunks = 0
    start = time.perf_counter()
    result.start_s = start
    last = start
    try:
        async with session.post(
            base_url.rstrip("/") + path, data=orjson.dumps(request_body(request, model, api)),
            headers={"Content-Type": "application/json", **(headers or {})},
        ) as response:
            if response.status != 200:
                text = (await response.read())[:300].decode(errors="replace")
                result.error = f"HTTP {response.status}: {text}"
                return result
            async for raw in response.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                now = time.perf_counter()
                event = orjson.loads(data)
                if "error" in event:
                    result.error = str(event["error"])[:300]
                    return result
                piece = _chunk_text(event)
                if piece:
                    if chunks == 0:
                        result.ttft_s = now - start
                    else:
                        result.itl_s.append(now - last)
                    last = now
                    chunks += 1
                usage = event.get("usage")
                if usage and usage.get("completion_tokens") is not None:
                    result.output_tokens = int(usage["completion_tokens"])
                    if usage.get("prompt_tokens") is not None:
                        result.prompt_tokens = int(usage["prompt_tokens"])
                    result.server_usage = True
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:300]
        return result
    if chunks == 0:
        result.error = "no tokens streamed"
        return result
    if not result.server_usage:
        result.output_tokens = chunks
    result.latency_s = last - start
    result.success = True
    return result
