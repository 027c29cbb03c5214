"""The OpenAI request fields that change what the simulator generates, checked as vLLM does.

Two kinds of refusal, both vLLM's. Messages are copied from vLLM's source as indexed
(main branch, at or after the release inferplane targets, `DEFAULT_VLLM_VERSION` 0.33.0):
`entrypoints/openai/{chat_completion,completion}/protocol.py`, `sampling_params.py`,
`pooling_params.py`, `v1/structured_output/backend_xgrammar.py`, the chat and completion
serving classes. The ` (parameter=..., value=...)` suffix is `VLLMValidationError.__str__`.

* the request models' `model_validator`s (`ChatCompletionRequest.check_logprobs`,
  `check_tool_usage`, `validate_response_format`; `CompletionRequest.check_logprobs`) fail
  while the body is parsed: the validation-error format (`validation.validator_error`);
* the serving layer and the engine's input processor (`create_error_response`): a plain
  `BadRequestError` whose message is the exception's text, e.g. the `--max-logprobs` limit
  in `SamplingParams._validate_logprobs`, the `--enable-auto-tool-choice` requirement in
  `OpenAIServingChat`, xgrammar's "features not supported" for a schema.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from inferplane.sim.config import SimEngineConfig
from inferplane.sim.protocol import ApiError
from inferplane.sim.schema import SchemaUnsupported, instance_for
from inferplane.sim.validation import validator_error

AUTO_TOOL_CHOICE = (
    '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
)
XGRAMMAR_UNSUPPORTED = "The provided JSON schema contains features not supported by xgrammar."
_JSON_OBJECT = {"sim": "filler"}  # what json_object mode "generates"
_CORRECT_USAGE = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'


@dataclass(frozen=True)
class ToolCall:
    """A forced tool call: the function and the JSON text of its arguments."""

    name: str
    arguments: str
    required: bool  # tool_choice "required": finish_reason "tool_calls"; named: "stop"


@dataclass(frozen=True)
class Fields:
    """What one request asks for beyond plain filler text."""

    n: int = 1
    logprobs: int | None = None  # top-k per token when logprobs were asked, else None
    echo: bool = False
    json_text: str | None = None  # the forced JSON text (response_format), else None
    tool: ToolCall | None = None
    prompt_logprobs: int | None = None  # vLLM's prompt_logprobs: top-k per prompt token


def _n(body: dict[str, Any]) -> int:
    n = body.get("n")
    n = 1 if n is None else n
    if isinstance(n, bool) or not isinstance(n, int):
        raise ApiError(400, "n must be an integer", "n")
    if n < 1:
        raise ApiError(400, f"n must be at least 1, got {n}.")  # vLLM names no param here
    return n


def _check_max_logprobs(
    requested: int, config: SimEngineConfig, vocab_size: int, *, prompt: bool = False
) -> int:
    """SamplingParams._validate_logprobs: -1 means the whole vocabulary."""
    limit = vocab_size if config.max_logprobs == -1 else config.max_logprobs
    count = vocab_size if requested == -1 else requested
    kind, parameter = ("prompt", "prompt_logprobs") if prompt else ("sample", "logprobs")
    if count > limit:
        raise ApiError(
            400,
            f"Requested {kind} logprobs of {count}, which is greater than max allowed: "
            f"{limit} (parameter={parameter}, value={count})",
            parameter,
        )
    return count


def _check_prompt_logprobs(body: dict[str, Any]) -> None:
    """The prompt_logprobs part of both request models' check_logprobs."""
    value = body.get("prompt_logprobs")
    if value is None:
        return
    if body.get("stream") and (value > 0 or value == -1):
        raise validator_error(body, "`prompt_logprobs` are not available when `stream=True`.",
                              parameter="prompt_logprobs")
    if value < 0 and value != -1:
        raise validator_error(body, "`prompt_logprobs` must be a positive value or -1.",
                              parameter="prompt_logprobs", value=value)


def _prompt_logprobs(body: dict[str, Any], config: SimEngineConfig, vocab_size: int
                     ) -> int | None:
    value = body.get("prompt_logprobs")
    if value is None:
        return None
    return _check_max_logprobs(int(value), config, vocab_size, prompt=True)


def _structured(body: dict[str, Any]) -> str | None:
    """The text response_format (or vLLM's own `structured_outputs`) forces; a schema the
    simulator cannot satisfy is refused."""
    extra = body.get("structured_outputs")
    if isinstance(extra, dict):
        return _structured_outputs(extra)
    response_format = body.get("response_format")
    if not isinstance(response_format, dict):
        return None
    kind = response_format.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return json.dumps(_JSON_OBJECT)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if schema is None:  # vLLM then constrains to any JSON object
            return json.dumps(_JSON_OBJECT)
        return json.dumps(_instance(schema), ensure_ascii=False)
    raise ApiError(
        400,
        f"response_format type {kind!r} is not simulated (the simulator produces text, "
        "json_object and json_schema); drop it or use one of those",
        "response_format",
    )


def _structured_outputs(params: dict[str, Any]) -> str | None:
    """vLLM's `structured_outputs` extension: `json` (a schema) and `choice` are simulated."""
    given = [k for k in ("json", "regex", "choice", "grammar", "json_object",
                         "structural_tag") if params.get(k) not in (None, False)]
    if not given:
        return None
    kind = given[0]
    if kind == "json":
        schema = params["json"]
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError:
                raise ApiError(400, "Invalid JSON grammar specification.") from None
        return json.dumps(_instance(schema), ensure_ascii=False)
    if kind == "json_object":
        return json.dumps(_JSON_OBJECT)
    if kind == "choice":
        choices = params["choice"]
        if not isinstance(choices, list) or not choices:
            raise ApiError(400, "structured_outputs.choice must be a non-empty list of "
                                "strings", "structured_outputs")
        return str(choices[0])
    raise ApiError(
        400,
        f"structured_outputs.{kind} is not simulated (the simulator cannot sample under a "
        "regex or grammar); use json or choice, or test this against vLLM",
        "structured_outputs",
    )


def _instance(schema: Any) -> Any:
    try:
        return instance_for(schema)
    except SchemaUnsupported:
        # vLLM's xgrammar backend refuses schemas it cannot compile with this message.
        raise ApiError(400, XGRAMMAR_UNSUPPORTED) from None


def _structured_count(body: dict[str, Any], parameter: str | None) -> None:
    """check_structured_outputs_count: one of json, regex, choice."""
    params = body.get("structured_outputs")
    if not isinstance(params, dict):
        return
    if sum(params.get(k) is not None for k in ("json", "regex", "choice")) > 1:
        raise validator_error(body, "You can only use one kind of constraints for structured "
                              "outputs ('json', 'regex' or 'choice').", parameter=parameter)


def chat_validators(body: dict[str, Any]) -> None:
    """ChatCompletionRequest's model validators, in vLLM's order."""
    response_format = body.get("response_format")
    if (
        isinstance(response_format, dict)
        and response_format.get("type") == "json_schema"
        and response_format.get("json_schema") is None
    ):
        raise validator_error(
            body,
            "When response_format type is 'json_schema', the 'json_schema' field must be "
            "provided.",
            parameter="response_format",
        )
    _check_prompt_logprobs(body)
    top = body.get("top_logprobs")
    if top is not None:
        if top < 0 and top != -1:
            raise validator_error(body, "`top_logprobs` must be a positive value or -1.",
                                  parameter="top_logprobs", value=top)
        if (top == -1 or top > 0) and not body.get("logprobs"):
            raise validator_error(
                body, "when using `top_logprobs`, `logprobs` must be set to true.",
                parameter="top_logprobs",
            )
    _structured_count(body, None)
    params = body.get("structured_outputs")
    constrained = isinstance(params, dict) and any(
        params.get(k) is not None for k in ("json", "regex", "choice"))
    if constrained and body.get("tool_choice", "none") not in ("none", "auto", "required"):
        raise validator_error(body, "You can only either use constraints for structured "
                              "outputs or tools, not both.")
    _check_tool_usage(body)


def _check_tool_usage(body: dict[str, Any]) -> None:
    tools = body.get("tools")
    if tools == []:
        raise validator_error(
            body, "`tools` must not be an empty array. Either provide at least one tool or "
            "omit the field entirely.", parameter="tools",
        )
    choice = body.get("tool_choice", "auto" if tools else None)
    if choice is None or choice == "none":
        return
    if tools is None:
        raise validator_error(body, "When using `tool_choice`, `tools` must be set.",
                              parameter="tool_choice")
    if choice not in ("auto", "required") and not isinstance(choice, dict):
        raise validator_error(
            body, f"Invalid value for `tool_choice`: {choice}! Only named tools, \"none\", "
            "\"auto\" or \"required\" are supported.", parameter="tool_choice",
        )
    if isinstance(choice, dict):
        function = choice.get("function")
        if not isinstance(function, dict):
            raise validator_error(
                body, f"Invalid value for `function`: `{function}` in `tool_choice`! "
                f"{_CORRECT_USAGE}", parameter="tool_choice.function",
            )
        if "name" not in function:
            raise validator_error(
                body, f"Expected field `name` in `function` in `tool_choice`! "
                f"{_CORRECT_USAGE}", parameter="tool_choice.function.name",
            )
        name = function["name"]
        if not isinstance(name, str) or not name:
            raise validator_error(
                body, f"Invalid `name` in `function`: `{name}` in `tool_choice`! "
                f"{_CORRECT_USAGE}", parameter="tool_choice.function.name",
            )
        if not any(_tool_name(tool) == name for tool in tools):
            raise validator_error(
                body, "The tool specified in `tool_choice` does not match any of the "
                "specified `tools`", parameter="tool_choice",
            )


def _tool_name(tool: Any) -> str | None:
    function = tool.get("function") if isinstance(tool, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else None


def _tool_call(body: dict[str, Any], config: SimEngineConfig) -> ToolCall | None:
    tools = body.get("tools")
    if not tools:
        return None
    choice = body.get("tool_choice", "auto")
    if choice in (None, "none"):
        return None
    if choice == "auto":
        if not config.enable_auto_tool_choice:
            raise ApiError(400, AUTO_TOOL_CHOICE)
        return None  # the simulated model "decides" to answer in text
    if not config.tool_call_parser:
        # OpenAIServingChat: a forced call needs a parser to turn the output into tool_calls.
        what = ('"required"' if choice == "required"
                else f'function "{choice["function"]["name"]}"')
        raise ApiError(400, f"tool_choice={what} requires --tool-call-parser to be set")
    if choice == "required":
        tool = tools[0]  # a model forced to call some tool: the sim calls the first
    else:
        tool = next(t for t in tools if _tool_name(t) == choice["function"]["name"])
    function = tool.get("function") or {}
    parameters = function.get("parameters")
    # vLLM: no parameters (or strict false) constrains the arguments to any JSON object.
    schema = parameters if isinstance(parameters, (dict, bool)) else {"type": "object"}
    if schema is True or schema == {}:
        schema = {"type": "object"}
    arguments = json.dumps(_instance(schema), ensure_ascii=False)
    return ToolCall(str(function.get("name")), arguments, required=choice == "required")


def chat_fields(body: dict[str, Any], config: SimEngineConfig, vocab_size: int) -> Fields:
    """The generation fields of a chat request (after `chat_validators`)."""
    n = _n(body)
    tool = _tool_call(body, config)
    logprobs = None
    if body.get("logprobs"):
        logprobs = _check_max_logprobs(int(body.get("top_logprobs") or 0), config, vocab_size)
    json_text = None if tool is not None else _structured(body)
    return Fields(n=n, logprobs=logprobs, json_text=json_text, tool=tool,
                  prompt_logprobs=_prompt_logprobs(body, config, vocab_size))


def completion_fields(body: dict[str, Any], config: SimEngineConfig, vocab_size: int) -> Fields:
    """The generation fields of a completions request (its model validators first)."""
    _structured_count(body, "structured_outputs")
    prompt = body.get("prompt")
    if prompt is None or prompt == "":
        raise validator_error(body, "Either prompt or prompt_embeds must be provided and "
                              "non-empty.", parameter="prompt")
    _check_prompt_logprobs(body)
    logprobs = body.get("logprobs")
    if logprobs is not None and logprobs < 0 and logprobs != -1:
        raise validator_error(body, "`logprobs` must be a positive value or -1.",
                              parameter="logprobs", value=logprobs)
    if body.get("suffix") is not None:
        # vLLM's serving check (only fill-in-the-middle renderers take a suffix)
        raise ApiError(400, "suffix is only supported for models with FIM completion "
                            "rendering", "suffix")
    n = _n(body)
    count = None if logprobs is None else _check_max_logprobs(logprobs, config, vocab_size)
    return Fields(n=n, logprobs=count, echo=bool(body.get("echo")), json_text=_structured(body),
                  prompt_logprobs=_prompt_logprobs(body, config, vocab_size))
