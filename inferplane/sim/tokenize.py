"""vLLM's `POST /tokenize` and `POST /detokenize` on a simulated engine.

    /tokenize   {"model", "prompt"} or {"model", "messages"}
                -> {"count", "max_model_len", "tokens", "token_strs"}
    /detokenize {"model", "tokens"} -> {"prompt"}

Token ids are the engine's tokenizer's (the model's `tokenizer.json`, else the approximation
of `tokens.py`, whose ids cannot be decoded: /detokenize then answers 400 saying so).
`return_token_strs: true` adds each token's text, as vLLM does.
"""

from __future__ import annotations

from typing import Any

from inferplane.sim.build import EngineParts
from inferplane.sim.protocol import ApiError
from inferplane.sim.tokens import render_chat


def tokenize(parts: EngineParts, body: dict[str, Any], max_model_len: int) -> dict[str, Any]:
    """The /tokenize answer for a request body (the model name already checked)."""
    tokenizer = parts.tokenizer
    messages = body.get("messages")
    if messages is not None:
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ApiError(400, "messages must be a list of message objects", "messages")
        text = render_chat(tokenizer.chat_family, messages)
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise ApiError(400, "prompt must be a string (or send messages)", "prompt")
        text = prompt
    ids = tokenizer.encode(text)
    strs = tokenizer.pieces(text) if body.get("return_token_strs") else None
    return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids,
            "token_strs": strs}


def detokenize(parts: EngineParts, body: dict[str, Any]) -> dict[str, Any]:
    """The /detokenize answer: the text of `tokens`."""
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in tokens
    ):
        raise ApiError(400, "tokens must be a list of token ids", "tokens")
    text = parts.tokenizer.decode(list(tokens))
    if text is None:
        raise ApiError(
            400,
            "detokenize needs the model's tokenizer; this engine counts tokens approximately "
            "(no tokenizer.json in the model directory). Start the simulator with --model-dir "
            "pointing at a directory with tokenizer.json",
            "tokens",
        )
    return {"prompt": text}
