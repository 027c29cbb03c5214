"""Request validation the way vLLM's protocol models do it.

vLLM parses every request body into a pydantic model (`ChatCompletionRequest`,
`CompletionRequest`, `EmbeddingRequest`); a field of the wrong type fails validation and
its `RequestValidationError` handler answers 400:

    {"error": {"message": "<n> validation error(s): ...", "type": "Bad Request",
               "param": null, "code": 400}}

The simulator checks the same field types here before it reads any of them, so a malformed
body (`"messages": [1, 2]`, `"stream_options": "x"`) gets that 400 and never a 500. The
models are lax like vLLM's (a numeric string is coerced); unknown fields are allowed, as
vLLM allows and ignores them.
"""

from __future__ import annotations

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
        raise ApiError(400, _message(exc), error_type="Bad Request") from None


def _message(exc: ValidationError) -> str:
    """FastAPI's `str(RequestValidationError)` followed by its `errors()`, as vLLM joins them."""
    errors = [
        {
            "type": e["type"],
            "loc": ("body", *e["loc"]),
            "msg": e["msg"],
            "input": e.get("input"),
        }
        for e in exc.errors(include_url=False, include_context=False)
    ]
    head = f"{len(errors)} validation error{'s' if len(errors) != 1 else ''}:\n"
    return head + "".join(f"  {e}\n" for e in errors) + f" {errors}"


def validator_error(
    body: dict[str, Any], message: str, *, parameter: str | None = None, value: Any = None
) -> ApiError:
    """vLLM's 400 for a request model's `model_validator` (a `VLLMValidationError` raised
    while pydantic parses the body): the validation-error format, with `param` set."""
    extras = [f"{k}={v}" for k, v in (("parameter", parameter), ("value", value))
              if v is not None]
    text = f"{message} ({', '.join(extras)})" if extras else message
    error = {
        "type": "value_error",
        "loc": ("body",),
        "msg": f"Value error, {text}",
        "input": body,
        "ctx": {"error": _ExceptionRepr(f"VLLMValidationError({message!r})")},
    }
    head = "1 validation error:\n"
    return ApiError(400, head + f"  {error}\n" + f" {[error]}", parameter,
                    error_type="Bad Request")


class _ExceptionRepr:
    """Prints as the exception object FastAPI keeps in an error's ctx."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text
