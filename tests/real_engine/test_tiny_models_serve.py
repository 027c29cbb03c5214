"""The tier's foundation: both tiny models load in real vLLM and answer their endpoint."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

from real_vllm import RealEngine, start_vllm


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.loads(reply.read())


def test_tiny_chat_and_embedding_models_serve(
    vllm_venv: Path, tiny_models: dict[str, Path], real_vllm: list[RealEngine], tmp_path: Path
) -> None:
    chat = start_vllm(vllm_venv, tiny_models["tiny-llama"], "tiny-llama", tmp_path,
                      cores="0", wait=False)  # fmt: skip
    real_vllm.append(chat)
    embed = start_vllm(vllm_venv, tiny_models["tiny-qwen3"], "tiny-embed", tmp_path,
                       cores="1", extra_args=["--runner", "pooling"], wait=False)  # fmt: skip
    real_vllm.append(embed)
    chat.wait_ready()
    embed.wait_ready()

    reply = _post(chat.url + "/v1/chat/completions", {
        "model": "tiny-llama", "max_tokens": 8, "seed": 1,
        "messages": [{"role": "user", "content": "hello"}],
    })  # fmt: skip
    assert reply["choices"][0]["message"]["role"] == "assistant"
    assert 1 <= reply["usage"]["completion_tokens"] <= 8

    vectors = _post(embed.url + "/v1/embeddings", {"model": "tiny-embed", "input": ["a", "b"]})
    assert [len(item["embedding"]) for item in vectors["data"]] == [128, 128]
    norm = sum(x * x for x in vectors["data"][0]["embedding"]) ** 0.5
    assert abs(norm - 1.0) < 1e-3  # vLLM normalises pooled embeddings
