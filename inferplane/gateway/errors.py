"""OpenAI-shaped error bodies, as vLLM's server returns them: the one renderer.

Every refusal the gateway writes (its own 4xx/5xx, tenancy's 401/403/429, unknown models and
response ids, routes it does not serve) goes through `openai_error`, so they all read
`{"error": {"message", "type", "param", "code"}}` with the same field order.
"""

from __future__ import annotations

import orjson

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    413: "BadRequestError",
    429: "RateLimitError",
    499: "ClientClosedRequest",
    500: "InternalServerError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}


class ClientError(Exception):
    """A request the gateway refuses before routing (4xx)."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def openai_error(message: str, type_: str, code: int | str, param: str | None = None) -> bytes:
    """`{"error": {"message", "type", "param", "code"}}` as bytes."""
    return orjson.dumps(
        {"error": {"message": message, "type": type_, "param": param, "code": code}}
    )


def error_body(status: int, message: str, param: str | None = None) -> bytes:
    """The gateway's own error for `status`: vLLM's type name, the status as code."""
    return openai_error(message, _TYPES.get(status, "APIError"), status, param)


def sse_error_event(status: int, message: str) -> bytes:
    """The final event of a stream the gateway had to end, followed by `[DONE]` as vLLM does."""
    return b"data: " + error_body(status, message) + b"\n\ndata: [DONE]\n\n"
