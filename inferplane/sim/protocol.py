"""Request parsing and response bodies in vLLM's OpenAI-compatible shapes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError",
               503: "ServiceUnavailableError"}


# vLLM's EngineDeadError text (vllm/v1/engine/exceptions.py, 0.32), answered as a 500
# InternalServerError, in-band on a stream whose HTTP 200 was already sent.
ENGINE_DEAD_MESSAGE = (
    "EngineCore encountered an issue. See stack trace (above) for the root cause."
)


class ApiError(Exception):
    """An error answered as `{"error": {message, type, param, code}}` (vLLM >= 0.10)."""

    def __init__(
        self, status: int, message: str, param: str | None = None, error_type: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.error_type = error_type  # vLLM's validation errors say "Bad Request"

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type or ERROR_TYPES.get(self.status, "BadRequestError"),
                "param": self.param,
                "code": self.status,
            }
        }


def engine_dead() -> ApiError:
    """What vLLM answers once its engine core died."""
    return ApiError(500, ENGINE_DEAD_MESSAGE, error_type="InternalServerError")


@dataclass(frozen=True)
class SamplingRequest:
    """The fields of a completion request that change what the simulator does."""

    model: str
    stream: bool
    include_usage: bool
    max_tokens: int | None
    ignore_eos: bool
    stop: list[str]
    continuous_usage: bool = False  # stream_options.continuous_usage_stats: usage per chunk


def _int_field(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{name} must be an integer", name)
    if value < 1:
        raise ApiError(400, f"{name} must be at least 1, got {value}.", name)
    return value


def parse_sampling(body: dict[str, Any], *, chat: bool) -> SamplingRequest:
    model = body.get("model")
    if not isinstance(model, str):
        raise ApiError(400, "model must be a string", "model")
    max_tokens = _int_field(body, "max_completion_tokens") if chat else None
    if max_tokens is None:
        max_tokens = _int_field(body, "max_tokens")
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise ApiError(400, "stop must be a string or a list of strings", "stop")
    options = body.get("stream_options") or {}
    stream = bool(body.get("stream", False))
    if options and not stream:
        raise ApiError(
            400, "Stream options can only be defined when `stream=True`.", "stream_options"
        )
    return SamplingRequest(
        model=model,
        stream=stream,
        include_usage=bool(options.get("include_usage", False)),
        continuous_usage=bool(options.get("include_usage", False))
        and bool(options.get("continuous_usage_stats", False)),
        max_tokens=max_tokens,
        ignore_eos=bool(body.get("ignore_eos", False)),
        stop=stop,
    )


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens} if cached_tokens else None,
    }


def chat_choice(
    index: int, message: dict[str, Any], logprobs: dict[str, Any] | None, finish_reason: str
) -> dict[str, Any]:
    return {"index": index, "message": message, "logprobs": logprobs,
            "finish_reason": finish_reason, "stop_reason": None}


def chat_response(
    request_id: str, model: str, created: int, choices: list[dict[str, Any]],
    use: dict[str, Any],
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": use,
        "prompt_logprobs": None,
    }


def chat_chunk(
    request_id: str, model: str, created: int, index: int, delta: dict[str, Any],
    finish_reason: str | None, logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": index, "delta": delta, "logprobs": logprobs,
                     "finish_reason": finish_reason}],
    }


def completion_choice(
    index: int, text: str, logprobs: dict[str, Any] | None, finish_reason: str
) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason,
            "stop_reason": None, "prompt_logprobs": None}


def completion_response(
    request_id: str, model: str, created: int, choices: list[dict[str, Any]],
    use: dict[str, Any],
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": use,
    }


def completion_chunk(
    request_id: str, model: str, created: int, index: int, text: str,
    finish_reason: str | None, logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": index, "text": text, "logprobs": logprobs,
                     "finish_reason": finish_reason, "stop_reason": None}],
    }


def usage_chunk(
    request_id: str, model: str, created: int, obj: str, use: dict[str, Any]
) -> dict[str, Any]:
    return {"id": request_id, "object": obj, "created": created, "model": model,
            "choices": [], "usage": use}
