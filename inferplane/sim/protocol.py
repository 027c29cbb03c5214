"""Request parsing and response bodies in vLLM's OpenAI-compatible shapes."""

from __future__ import annotations

import re
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
        # vLLM's create_error_response sanitizes its messages; its request-validation
        # handler ("Bad Request") does not (entrypoints/serve/exception_handling, 0.32).
        message = self.message if self.error_type == "Bad Request" else sanitize(self.message)
        return {
            "error": {
                "message": message,
                "type": self.error_type or ERROR_TYPES.get(self.status, "BadRequestError"),
                "param": self.param,
                "code": self.status,
            }
        }


# What vLLM 0.32's sanitize_message takes out of an error message before a client sees it
# (entrypoints/serve/exception_handling/utils.py): object addresses, traceback lines and
# file paths, each path under a system root or ending in a file name read as "<path>".
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>")
_TRACEBACK = re.compile(r'\n?\s*File "[^"]+", line \d+, in \S+(\n\s+.*)?')
_ROOTED_PATH = re.compile(r"/(?:home|usr|opt|var|tmp|root|lib|mnt|srv)(?:/[\w.\-]+)+")
_FILE_PATH = re.compile(r"(?:/[\w\-]+)+/[\w\-]+\.\w+")


def sanitize(message: str) -> str:
    """An error message as vLLM answers it: no addresses, tracebacks or file paths."""
    message = _TRACEBACK.sub("", _ADDRESS.sub(">", message))
    return _FILE_PATH.sub("<path>", _ROOTED_PATH.sub("<path>", message)).strip()


def prompt_too_long(max_model_len: int, prompt_tokens: int) -> ApiError:
    """vLLM 0.32's refusal of a prompt longer than the context (the input processor's)."""
    return ApiError(
        400,
        f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
        f"contains at least {prompt_tokens} input tokens, which exceeds this limit even "
        "without any output tokens. Please reduce the length of the input prompt. "
        f"(parameter=input_tokens, value={prompt_tokens})",
        "input_tokens",
    )


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
        raise ApiError(400, "Stream options can only be defined when `stream=True`. "
                            "(parameter=stream_options)", "stream_options")
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


# vLLM's system_fingerprint is `vllm-<version>-<build hash>`; the simulator names itself.
SYSTEM_FINGERPRINT = "vllm-sim-inferplane"
# Fields vLLM 0.32 sends as null unless a feature the simulator does not model is used
# (KV transfer, EC transfer, request metrics, prompt echo of token ids, MoE routing).
_RESPONSE_NULLS = {"service_tier": None, "kv_transfer_params": None,
                   "ec_transfer_params": None, "metrics": None}
_CHOICE_NULLS = {"token_ids": None, "routed_experts": None}
_MESSAGE_NULLS = {"refusal": None, "annotations": None, "audio": None, "function_call": None,
                  "reasoning": None}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens} if cached_tokens else None,
        "completion_tokens_details": None,
    }


def stream_usage(use: dict[str, Any]) -> dict[str, Any]:
    """A stream's usage: vLLM leaves out the details that are null."""
    return {k: v for k, v in use.items() if v is not None}


def chat_message(content: str | None, tool_calls: list[dict[str, Any]] | None = None
                 ) -> dict[str, Any]:
    """vLLM's ChatMessage; `tool_calls` only when there are some (vLLM omits an empty list)."""
    message: dict[str, Any] = {"role": "assistant", "content": content, **_MESSAGE_NULLS}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def chat_choice(
    index: int, message: dict[str, Any], logprobs: dict[str, Any] | None, finish_reason: str
) -> dict[str, Any]:
    return {"index": index, "message": message, "logprobs": logprobs,
            "finish_reason": finish_reason, "stop_reason": None, **_CHOICE_NULLS}


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
        "prompt_token_ids": None,
        "prompt_text": None,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        **_RESPONSE_NULLS,
    }


def chat_chunk(
    request_id: str, model: str, created: int, index: int, delta: dict[str, Any],
    finish_reason: str | None, logprobs: dict[str, Any] | None = None, *, role: bool = False,
) -> dict[str, Any]:
    """One chat stream chunk: the role chunk carries the prompt fields (null), token chunks
    their token ids (null), the last chunk of a choice its stop_reason, as vLLM's do."""
    choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": logprobs,
                              "finish_reason": finish_reason}
    top: dict[str, Any] = {}
    if role:
        top = {"prompt_token_ids": None, "prompt_text": None}
    else:
        choice["token_ids"] = None
        if finish_reason is not None:
            choice["stop_reason"] = None
    return {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
        **top,
    }


def completion_choice(
    index: int, text: str, logprobs: dict[str, Any] | None, finish_reason: str
) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason,
            "stop_reason": None, "prompt_logprobs": None, "prompt_token_ids": None,
            **_CHOICE_NULLS}


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
        "system_fingerprint": SYSTEM_FINGERPRINT,
        **_RESPONSE_NULLS,
    }


def completion_chunk(
    request_id: str, model: str, created: int, index: int, text: str,
    finish_reason: str | None, logprobs: dict[str, Any] | None = None,
    prompt_token_ids: list[int] | None = None,
) -> dict[str, Any]:
    """One completions stream chunk; an echoing stream's first chunk has the prompt's ids."""
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": index, "text": text, "logprobs": logprobs,
                     "finish_reason": finish_reason, "stop_reason": None,
                     "prompt_token_ids": prompt_token_ids, "token_ids": None}],
    }


def usage_chunk(
    request_id: str, model: str, created: int, obj: str, use: dict[str, Any]
) -> dict[str, Any]:
    return {"id": request_id, "object": obj, "created": created, "model": model,
            "choices": [], "usage": stream_usage(use),
            "system_fingerprint": SYSTEM_FINGERPRINT}
