"""Turn pydantic's validation errors into messages a person can act on: what is wrong, the
value, and the fix (with a 'did you mean' for misspelt keys and choices)."""

from __future__ import annotations

import re
import types
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic_core import ErrorDetails

from inferplane.spec.problems import ISSUES_ERROR_TYPE, Issue, Loc
from inferplane.spec.suggest import closest, did_you_mean

# Keys people often write for a field (vLLM flag names, other tools' spellings).
KEY_SYNONYMS: dict[str, str] = {
    "tp": "tensor_parallel_size",
    "tensor_parallel": "tensor_parallel_size",
    "model": "source",
    "path": "source",
    "model_path": "source",
    "url": "endpoints",
    "urls": "endpoints",
    "endpoint": "endpoints",
    "base_url": "endpoints",
    "api_base": "endpoints",
    "gpu_util": "gpu_memory_utilization",
    "gpu_memory": "gpu_memory_utilization",
    "max_len": "max_model_len",
    "context_length": "max_model_len",
    "served_name": "served_model_name",
    "quant": "quantization",
    "args": "extra_args",
    "engine_args": "extra_args",
    "vllm_args": "extra_args",
    "environment": "env",
    "num_gpus": "count",
    "gpus": "count",
    "type": "gpu_type",
}


@dataclass(frozen=True)
class Explained:
    loc: Loc
    message: str
    value: Any
    fix: str | None
    at_key: bool  # point at the key (unknown or missing key), not the value


def explain(errors: list[ErrorDetails], root: type[BaseModel]) -> list[Explained]:
    out: list[Explained] = []
    for error in errors:
        loc = tuple(error["loc"])
        ctx = error.get("ctx") or {}
        if error["type"] == ISSUES_ERROR_TYPE:
            issues: tuple[Issue, ...] = ctx["issues"]
            out.extend(Explained((*loc, *i.loc), i.message, i.value, i.fix, False) for i in issues)
            continue
        out.append(_explain_one(error, loc, ctx, root))
    return out


def _explain_one(
    error: ErrorDetails, loc: Loc, ctx: dict[str, Any], root: type[BaseModel]
) -> Explained:
    kind = error["type"]
    value = error.get("input")
    if "fix" in ctx:  # our own custom errors carry their fix
        # A whole model's mapping is noise as a value; the path already says which one.
        shown = None if isinstance(value, dict) else value
        return Explained(loc, error["msg"], shown, str(ctx["fix"]), False)
    if kind == "extra_forbidden":
        key = str(loc[-1])
        return Explained(loc, f"unknown key {key!r}", value, _unknown_key_fix(key, loc, root), True)
    if kind == "missing":
        key = str(loc[-1])
        return Explained(loc, f"missing required key {key!r}", None, f"add `{key}:`", True)
    if value is None and kind in ("list_type", "dict_type", "model_type"):
        return Explained(loc, "is empty", None, "fill it in, or remove the key", False)
    handler = _HANDLERS.get(kind)
    if handler is not None:
        message, fix = handler(value, ctx)
        return Explained(loc, message, value, fix, False)
    return Explained(loc, _plain(error["msg"]), value, None, False)


def _plain(msg: str) -> str:
    """pydantic's "Input should be …" -> "must be …"."""
    return re.sub(r"^Input should be", "must be", msg)


def _unknown_key_fix(key: str, loc: Loc, root: type[BaseModel]) -> str:
    valid = fields_at(root, loc[:-1])
    if not valid:
        return "remove it"
    synonym = KEY_SYNONYMS.get(key.lower().replace("-", "_"))
    if synonym in valid:
        return f"did you mean {synonym!r}?"
    match = closest(key, valid)
    if match is not None:
        return f"did you mean {match!r}?"
    return f"remove it; valid keys here: {', '.join(sorted(valid))}"


def fields_at(root: type[BaseModel], loc: Loc) -> list[str]:
    """The field names of the model found at `loc` (empty when it is not a model)."""
    candidates: list[Any] = [root]
    for part in loc:
        following: list[Any] = []
        for tp in candidates:
            following += _step(tp, part)
        candidates = following
    for tp in candidates:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            return list(tp.model_fields)
    return []


def _step(tp: Any, part: str | int) -> list[Any]:
    out: list[Any] = []
    for member in _members(tp):
        if isinstance(member, type) and issubclass(member, BaseModel):
            field = member.model_fields.get(str(part))
            if field is not None:
                out += _members(field.annotation)
            continue
        origin = typing.get_origin(member)
        args = typing.get_args(member)
        if origin is list and isinstance(part, int) and args:
            out += _members(args[0])
        elif origin is dict and isinstance(part, str) and len(args) == 2:
            out += _members(args[1])
    return out


def _members(tp: Any) -> list[Any]:
    """Strip Annotated and unions down to the concrete types."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _members(typing.get_args(tp)[0])
    if origin is typing.Union or origin is types.UnionType:
        out: list[Any] = []
        for arg in typing.get_args(tp):
            out += _members(arg)
        return out
    return [tp]


def _choices(ctx: dict[str, Any]) -> list[str]:
    return re.findall(r"'([^']*)'", str(ctx.get("expected", "")))


def _literal(value: Any, ctx: dict[str, Any]) -> tuple[str, str]:
    choices = _choices(ctx)
    message = f"must be one of: {', '.join(choices)}"
    if isinstance(value, str):
        return message, did_you_mean(value, choices)
    return message, f"use one of: {', '.join(choices)}"


def _int(value: Any, ctx: dict[str, Any]) -> tuple[str, str]:
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return "must be a whole number, not a string", f"remove the quotes: {value.strip()}"
    if isinstance(value, float):
        return "must be a whole number", f"use {int(value)} or {int(value) + 1}"
    return "must be a whole number", "write a number such as 1"


def _float(value: Any, ctx: dict[str, Any]) -> tuple[str, str]:
    if isinstance(value, str):
        return "must be a number, not a string", "write the number without quotes"
    return "must be a number", "write a number such as 0.5"


def _bound(symbol: str, key: str) -> Any:
    def handler(value: Any, ctx: dict[str, Any]) -> tuple[str, str]:
        bound = ctx.get(key)
        return f"must be {symbol} {bound}", f"use a value {symbol} {bound}"

    return handler


def _too_short(value: Any, ctx: dict[str, Any]) -> tuple[str, str]:
    least = ctx.get("min_length", 1)
    if least == 1:
        return "must not be empty", "add at least one entry"
    return f"needs at least {least} entries", f"add at least {least} entries"


_Handler = typing.Callable[[Any, dict[str, Any]], tuple[str, str]]

_HANDLERS: dict[str, _Handler] = {
    "literal_error": _literal,
    "int_type": _int,
    "int_parsing": _int,
    "int_from_float": _int,
    "float_type": _float,
    "float_parsing": _float,
    "finite_number": lambda v, c: ("must be a finite number", "write a number such as 0.5"),
    "bool_type": lambda v, c: ("must be true or false", "write true or false (no quotes)"),
    "string_type": lambda v, c: ("must be a string", f'quote it: "{v}"'),
    "string_too_short": lambda v, c: ("must not be empty", "write a value"),
    "list_type": lambda v, c: ("must be a list", "write it as a YAML list: [a, b] or '- a' lines"),
    "dict_type": lambda v, c: ("must be a mapping (key: value)", "write key: value pairs"),
    "model_type": lambda v, c: ("must be a mapping (key: value)", "write key: value pairs"),
    "model_attributes_type": lambda v, c: (
        "must be a mapping (key: value)",
        "write key: value pairs",
    ),
    "too_short": _too_short,
    "greater_than": _bound(">", "gt"),
    "greater_than_equal": _bound(">=", "ge"),
    "less_than": _bound("<", "lt"),
    "less_than_equal": _bound("<=", "le"),
}
