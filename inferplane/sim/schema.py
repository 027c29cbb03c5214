"""A minimal JSON instance for a JSON schema: what a structured-output backend would force.

vLLM constrains decoding with a grammar built from the schema (xgrammar by default), so a
real model's output always validates. The simulator cannot sample under a grammar; it builds
the smallest plain instance instead: `const`, the first `enum` value, every declared
property (required ones at least), `minItems` items, numbers inside their bounds, strings of
filler text within their length bounds, local `$ref`s, the first valid `anyOf`/`oneOf`
branch. A keyword it cannot honour (`pattern`, `not`, `if`/`then`, `patternProperties`, an
unknown `format`, ...) raises `SchemaUnsupported`, and every instance is checked with
`jsonschema` before it is returned, so the simulator refuses a schema rather than answer
JSON that does not validate.
"""

from __future__ import annotations

import math
from typing import Any

import jsonschema

# Keywords that change what is valid and that the generator does not implement.
_UNSUPPORTED = (
    "pattern", "patternProperties", "not", "if", "then", "else", "dependentSchemas",
    "dependentRequired", "dependencies", "contains", "propertyNames", "unevaluatedProperties",
    "unevaluatedItems", "minProperties", "maxProperties", "minContains", "maxContains",
)
_FORMATS = {
    "date": "2026-01-01",
    "date-time": "2026-01-01T00:00:00Z",
    "time": "00:00:00Z",
    "email": "sim@example.com",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "uri": "https://example.com/sim",
    "hostname": "example.com",
    "ipv4": "192.0.2.1",
    "ipv6": "2001:db8::1",
}
_TEXT = "sim filler"
_MAX_DEPTH = 32


class SchemaUnsupported(Exception):
    """The schema uses something the simulator cannot satisfy (or is not a valid schema)."""


def instance_for(schema: Any) -> Any:
    """A JSON value that validates against `schema`; raises SchemaUnsupported otherwise."""
    if not isinstance(schema, (dict, bool)):
        raise SchemaUnsupported(f"a JSON schema is an object or a boolean, not {schema!r}")
    try:
        validator_cls = jsonschema.validators.validator_for(schema)
        validator_cls.check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        raise SchemaUnsupported(f"invalid JSON schema: {exc.message}") from None
    value = _Builder(schema).build(schema, 0)
    validator = validator_cls(schema, format_checker=validator_cls.FORMAT_CHECKER)
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is not None:  # a combination the generator got wrong: refuse, never answer it
        raise SchemaUnsupported(f"the generated instance does not validate: {error.message}")
    return value


class _Builder:
    def __init__(self, root: dict[str, Any] | bool) -> None:
        self.root = root

    def build(self, schema: Any, depth: int) -> Any:
        if depth > _MAX_DEPTH:
            raise SchemaUnsupported("the schema nests deeper than the simulator follows")
        if schema is True or schema == {}:
            return _TEXT
        if schema is False or not isinstance(schema, dict):
            raise SchemaUnsupported(f"no value satisfies the schema {schema!r}")
        if "$ref" in schema:
            return self.build(self._resolve(schema["$ref"]), depth + 1)
        for key in _UNSUPPORTED:
            if key in schema:
                raise SchemaUnsupported(f"keyword {key!r} is not supported")
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise SchemaUnsupported("enum must be a non-empty list")
            return values[0]
        if "allOf" in schema:
            merged = {k: v for k, v in schema.items() if k != "allOf"}
            for part in schema["allOf"]:
                if not isinstance(part, dict) or set(part) & set(merged) - {"type"}:
                    raise SchemaUnsupported("allOf branches that overlap are not supported")
                merged.update(part)
            return self.build(merged, depth + 1)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self._first_branch(schema, key, depth)
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "null") if kind else None
        if kind is None:
            kind = _infer_type(schema)
        builder = {
            "object": self._object, "array": self._array, "string": self._string,
            "integer": self._integer, "number": self._number,
        }.get(kind)
        if builder is not None:
            return builder(schema, depth)
        if kind == "boolean":
            return True
        if kind == "null":
            return None
        raise SchemaUnsupported(f"type {kind!r} is not supported")

    def _resolve(self, ref: Any) -> Any:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise SchemaUnsupported(f"only local $ref (#/...) is supported, not {ref!r}")
        node: Any = self.root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                raise SchemaUnsupported(f"$ref {ref!r} points nowhere")
            node = node[part]
        return node

    def _first_branch(self, schema: dict[str, Any], key: str, depth: int) -> Any:
        rest = {k: v for k, v in schema.items() if k != key}
        problems: list[str] = []
        for branch in schema[key]:
            candidate = {**rest, **branch} if isinstance(branch, dict) else branch
            try:
                value = self.build(candidate, depth + 1)
            except SchemaUnsupported as exc:
                problems.append(str(exc))
                continue
            others = [b for b in schema[key] if b is not branch]
            if key == "oneOf" and any(_valid(value, b, self.root) for b in others):
                problems.append("the instance matches more than one oneOf branch")
                continue
            return value
        raise SchemaUnsupported(f"no {key} branch can be satisfied ({'; '.join(problems)})")

    def _object(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        properties = schema.get("properties") or {}
        required = list(schema.get("required") or [])
        value: dict[str, Any] = {}
        for name, sub in properties.items():
            value[name] = self.build(sub, depth + 1)
        for name in required:
            if name not in value:
                extra = schema.get("additionalProperties", True)
                value[name] = self.build(extra if isinstance(extra, dict) else True, depth + 1)
        return value

    def _array(self, schema: dict[str, Any], depth: int) -> list[Any]:
        low = int(schema.get("minItems", 0))
        high = schema.get("maxItems")
        prefix = schema.get("prefixItems") or []
        items = schema.get("items", True)
        count = max(low, len(prefix), 1 if high is None or high >= 1 else 0)
        if high is not None:
            count = min(count, int(high))
        values = [
            self.build(prefix[i] if i < len(prefix) else items, depth + 1) for i in range(count)
        ]
        if schema.get("uniqueItems") and len({repr(v) for v in values}) < len(values):
            raise SchemaUnsupported("uniqueItems with several equal minimal items")
        return values

    def _string(self, schema: dict[str, Any], depth: int) -> str:
        fmt = schema.get("format")
        if fmt is not None:
            if fmt not in _FORMATS:
                raise SchemaUnsupported(f"string format {fmt!r} is not supported")
            text = _FORMATS[fmt]
        else:
            text = _TEXT
        low = int(schema.get("minLength", 0))
        high = schema.get("maxLength")
        if len(text) < low:
            text = (text + " ") * (low // (len(text) + 1) + 1)
            text = text[:low]
        if high is not None and len(text) > int(high):
            if fmt is not None:
                raise SchemaUnsupported(f"format {fmt!r} does not fit maxLength {high}")
            text = text[: int(high)]
        return text

    def _integer(self, schema: dict[str, Any], depth: int) -> int:
        low, high = _bounds(schema, integer=True)
        step = schema.get("multipleOf")
        value = 0 if low is None or low <= 0 else math.ceil(low)
        if high is not None and value > high:
            value = math.floor(high)
        if step is not None:
            value = math.ceil(value / step) * step
            if isinstance(step, float) and not float(value).is_integer():
                raise SchemaUnsupported("multipleOf that yields no integer")
            value = int(value)
        if (low is not None and value < low) or (high is not None and value > high):
            raise SchemaUnsupported("no integer inside the bounds")
        return int(value)

    def _number(self, schema: dict[str, Any], depth: int) -> float | int:
        if "multipleOf" in schema:
            return self._integer(schema, depth)
        low, high = _bounds(schema, integer=False)
        value = 0.0 if low is None or low <= 0 else float(low)
        if high is not None and value > high:
            value = float(high)
        if (low is not None and value < low) or (high is not None and value > high):
            raise SchemaUnsupported("no number inside the bounds")
        return value


def _bounds(schema: dict[str, Any], *, integer: bool) -> tuple[float | None, float | None]:
    """Inclusive bounds; exclusive ones move by 1 for integers, by a small step otherwise."""
    step = 1 if integer else 1e-6
    low = schema.get("minimum")
    high = schema.get("maximum")
    if "exclusiveMinimum" in schema and not isinstance(schema["exclusiveMinimum"], bool):
        low = max(low, schema["exclusiveMinimum"] + step) if low is not None else (
            schema["exclusiveMinimum"] + step)
    if "exclusiveMaximum" in schema and not isinstance(schema["exclusiveMaximum"], bool):
        high = min(high, schema["exclusiveMaximum"] - step) if high is not None else (
            schema["exclusiveMaximum"] - step)
    return low, high


def _infer_type(schema: dict[str, Any]) -> str:
    if "properties" in schema or "required" in schema or "additionalProperties" in schema:
        return "object"
    if "items" in schema or "prefixItems" in schema or "minItems" in schema:
        return "array"
    if "minLength" in schema or "maxLength" in schema or "format" in schema:
        return "string"
    if "minimum" in schema or "maximum" in schema or "multipleOf" in schema:
        return "number"
    return "string"


def _valid(value: Any, schema: Any, root: Any) -> bool:
    if isinstance(schema, dict) and "$ref" in schema and isinstance(root, dict):
        schema = {**schema, "$defs": root.get("$defs", {}),
                  "definitions": root.get("definitions", {})}
    try:
        return bool(jsonschema.validators.validator_for(schema)(schema).is_valid(value))
    except (jsonschema.exceptions.SchemaError, jsonschema.exceptions.RefResolutionError):
        return True  # cannot tell: assume it matches, so the oneOf branch is refused
