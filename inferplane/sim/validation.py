"""Request validation the way vLLM's protocol models do it.

vLLM parses every request body into a pydantic model (`ChatCompletionRequest`,
`CompletionRequest`, `EmbeddingRequest`); a field of the wrong type fails validation and
its `RequestValidationError` handler answers 400:

    {"error": {"message": "<n> validation error(s):\n  {'type': ..., 'loc': 'body.field',
               ...}", "type": "Bad Request", "param": "body.field", "code": 400}}

The simulator checks the same field types here before it reads any of them, so a malformed
body (`"messages": [1, 2]`, `"stream_options": "x"`) gets that 400 and never a 500. The
models are lax like vLLM's (a numeric string is coerced); unknown fields are allowed, as
vLLM allows and ignores them.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from inferplane.sim.protocol import ApiError


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class _StreamOptions(_Model):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class _ChatMessage(_Model):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None


class _Sampling(_Model):
    model: str | None = None
    stream: bool | None = False
    stream_options: _StreamOptions | None = None
    max_tokens: int | None = None
    n: int | None = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    prompt_logprobs: int | None = None


class _Function(_Model):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class _Tool(_Model):
    type: Literal["function"] = "function"
    function: _Function


class _ResponseFormat(_Model):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: dict[str, Any] | None = None


class _ChatRequest(_Sampling):
    messages: list[_ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    tool_choice: str | dict[str, Any] | None = "none"
    tools: list[_Tool] | None = None
    response_format: _ResponseFormat | None = None


class _CompletionRequest(_Sampling):
    prompt: list[int] | list[list[int]] | str | list[str] | None = None
    echo: bool | None = False
    logprobs: int | None = None
    suffix: str | None = None
    response_format: _ResponseFormat | None = None


class _EmbeddingRequest(_Model):
    model: str | None = None
    input: list[int] | list[list[int]] | str | list[str]
    encoding_format: str = "float"
    dimensions: int | None = None
    user: str | None = None


_MODELS: dict[str, type[_Model]] = {
    "chat": _ChatRequest,
    "completion": _CompletionRequest,
    "embedding": _EmbeddingRequest,
}


def validate_request(body: dict[str, Any], kind: str) -> None:
    """Raise vLLM's 400 when `body` does not fit the endpoint's request model."""
    try:
        _MODELS[kind].model_validate(body)
    except ValidationError as exc:
        errors = [{"type": e["type"], "loc": ("body", *e["loc"]), "msg": e["msg"],
                   "input": e.get("input")}
                  for e in exc.errors(include_url=False, include_context=False)]
        raise validation_error(errors) from None


_MAX_REPORTED_ERRORS = 10  # vLLM's bounds on what a validation error echoes
_MAX_ERROR_INPUT_CHARS = 200
_INTERNAL = re.compile(r"[\[\]{}()]")
_INTERNAL_MARKERS = frozenset({"function-wrap", "function-after", "function-before",
                               "function-plain", "json-or-python", "lax-or-strict", "chain",
                               "default", "nullable", "tagged-union", "union", "str", "int",
                               "float", "bool", "list", "dict", "none"})


def _clean_loc(loc: tuple[Any, ...]) -> str:
    """vLLM's clean_loc_for_param: `('body', 'prompt', 'list[int]')` -> `body.prompt`."""
    parts = [str(p) for p in loc
             if not _INTERNAL.search(str(p)) and str(p).lower() not in _INTERNAL_MARKERS]
    return ".".join(parts or [str(p) for p in loc])


def _summary(value: Any) -> Any:
    if isinstance(value, str):
        return value if len(value) <= _MAX_ERROR_INPUT_CHARS else (
            value[:_MAX_ERROR_INPUT_CHARS] + "...[truncated]")
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        return f"<{type(value).__name__} of {len(value)} items>"
    return str(value)


def validation_error(errors: list[dict[str, Any]]) -> ApiError:
    """vLLM 0.32's RequestValidationError answer (`validation_exception_handler`): a count
    line, one line per error (loc cleaned, input summarised), param the first error's loc."""
    lines = []
    for error in errors[:_MAX_REPORTED_ERRORS]:
        shown = dict(error)
        shown["input"] = _summary(error.get("input"))
        shown["loc"] = _clean_loc(tuple(error["loc"]))
        lines.append(f"  {shown}\n")
    count = len(errors)
    label = "error" if count == 1 else "errors"
    message = f"{count} validation {label}:\n" + "".join(lines)
    if count > _MAX_REPORTED_ERRORS:
        message += f"  ...and {count - _MAX_REPORTED_ERRORS} more {label}\n"
    param = _clean_loc(tuple(errors[0]["loc"])) if errors else None
    return ApiError(400, message.rstrip(), param, error_type="Bad Request")


def validator_error(
    body: dict[str, Any], message: str, *, parameter: str | None = None, value: Any = None
) -> ApiError:
    """vLLM's 400 for a request model's `model_validator` (a `VLLMValidationError`): since
    vLLM 0.32 a plain BadRequestError, its message `VLLMValidationError.__str__`."""
    extras = [f"{k}={v}" for k, v in (("parameter", parameter), ("value", value))
              if v is not None]
    text = f"{message} ({', '.join(extras)})" if extras else message
    return ApiError(400, text, parameter)
