"""Validating the JSON body of a model-addressed request, cheaply.

Only what the gateway itself relies on is checked (model, stream, max_tokens and the
prompt container's type); everything else is the engine's business and its 4xx passes
through unchanged.
"""

from __future__ import annotations

from typing import Any

import orjson

from inferplane.gateway.errors import ClientError
from inferplane.gateway.names import check_model_name

# Fields holding the prompt per endpoint; checked only for their container type.
_PROMPT_FIELD: dict[str, tuple[str, type | tuple[type, ...]]] = {
    "/v1/chat/completions": ("messages", list),
    "/v1/completions": ("prompt", (str, list)),
    "/v1/embeddings": ("input", (str, list)),
}


def parse_body(body: bytes, path: str) -> dict[str, Any]:
    if not body:
        raise ClientError(400, "request body is empty; send a JSON object with a 'model' field")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ClientError(400, f"request body is not valid JSON: {exc}") from None
    if type(data) is not dict:
        raise ClientError(400, "request body must be a JSON object")
    model = data.get("model")
    if type(model) is not str or not model:
        raise ClientError(400, "'model' must be a non-empty string", "model")
    check_model_name(model)
    stream = data.get("stream")
    if stream is not None and type(stream) is not bool:
        raise ClientError(400, "'stream' must be a boolean", "stream")
    for name in ("max_tokens", "max_completion_tokens"):
        value = data.get(name)
        if value is not None and (type(value) is not int or value < 0):
            raise ClientError(400, f"'{name}' must be a non-negative integer", name)
    spec = _PROMPT_FIELD.get(path)
    if spec is not None:
        field, kinds = spec
        value = data.get(field)
        if value is None or not isinstance(value, kinds):
            raise ClientError(400, f"'{field}' is missing or has the wrong type", field)
    return data


def prefix_key(data: dict[str, Any], n_chars: int) -> bytes | None:
    """The leading `n_chars` of the prompt as the engine will see it, for prefix affinity."""
    parts: list[str] = []
    size = 0
    messages = data.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if not isinstance(message, dict):
                continue
            content = message.get("content")
            role = message.get("role")
            piece = f"{role}\x1f" if isinstance(role, str) else ""
            if isinstance(content, str):
                piece += content
            elif isinstance(content, list):
                piece += "".join(
                    p["text"]
                    for p in content
                    if isinstance(p, dict) and isinstance(p.get("text"), str)
                )
            parts.append(piece + "\x1e")
            size += len(piece) + 1
            if size >= n_chars:
                break
    else:
        prompt = data.get("prompt", data.get("input"))
        if isinstance(prompt, list) and prompt:
            prompt = prompt[0]
        if isinstance(prompt, str):
            parts.append(prompt)
        elif isinstance(prompt, list):  # token ids
            parts.append(",".join(str(t) for t in prompt[:n_chars]))
    if not parts:
        return None
    return "".join(parts)[:n_chars].encode()


def estimate_prompt_tokens(body: bytes) -> int:
    """A tokenizer-free upper-bound estimate (~4 bytes per token) for lane rules."""
    return len(body) // 4
