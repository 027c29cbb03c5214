"""Answers that must read the same on every route: a missing or wrong API key, and a
browser at the root (sent to the console; API clients keep JSON 404s)."""

from __future__ import annotations

from inferplane.gateway.asgi import Send
from inferplane.gateway.errors import openai_error

MISSING_KEY = "You didn't provide an API key. Send 'Authorization: Bearer KEY'."
WRONG_KEY = "Incorrect API key provided. Create one with `inferplane keys create`."


def key_message(authorization: bytes | None) -> str:
    return WRONG_KEY if authorization else MISSING_KEY


def key_refusal(authorization: bytes | None) -> bytes:
    """OpenAI's 401 body, the same on chat, /v1/models and /v1/responses."""
    return openai_error(key_message(authorization), "invalid_request_error", "invalid_api_key")


def wants_html(accept: bytes | None) -> bool:
    """A browser asks for text/html first; curl and SDKs send */* or application/json."""
    return accept is not None and b"text/html" in accept


async def send_redirect(send: Send, location: str) -> None:
    await send({"type": "http.response.start", "status": 303,
                "headers": [(b"location", location.encode()), (b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})
