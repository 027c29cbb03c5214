"""`load_fleet` / `parse_fleet`: YAML text -> `FleetSpec`, or every problem with file:line."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from inferplane.spec.explain import explain
from inferplane.spec.fleet import FleetSpec
from inferplane.spec.problems import FleetValidationError, Problem, format_loc
from inferplane.spec.yaml_source import PositionIndex, YamlReadError, read_yaml


def load_fleet(path: str | Path) -> FleetSpec:
    """Read and validate a fleet file. Raises `FleetValidationError` listing every problem."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise _file_error(str(path), "file not found", "check the path") from None
    except IsADirectoryError:
        raise _file_error(str(path), "is a directory", "give a fleet file (.yaml)") from None
    except UnicodeDecodeError:
        raise _file_error(str(path), "is not UTF-8 text", "save the file as UTF-8") from None
    except OSError as exc:
        raise _file_error(
            str(path), f"cannot be read: {exc.strerror}", "check its permissions"
        ) from None
    return parse_fleet(text, filename=str(path), base_dir=file.parent)


def parse_fleet(text: str, *, filename: str, base_dir: str | Path | None = None) -> FleetSpec:
    """Validate fleet YAML. Relative `source` paths resolve against `base_dir`, by default the
    directory of `filename`."""
    base = Path(base_dir) if base_dir is not None else Path(filename).parent
    try:
        data, index = read_yaml(text)
    except YamlReadError as exc:
        raise FleetValidationError(
            filename,
            [
                Problem(
                    filename, i.position.line, i.position.column, i.field, i.value, i.message, i.fix
                )
                for i in exc.issues
            ],
        ) from None
    if data is None:
        raise FleetValidationError(
            filename,
            [Problem(filename, 1, 1, "", None, "the fleet file is empty", _MINIMAL_FIX)],
        )
    if not isinstance(data, dict):
        raise FleetValidationError(
            filename,
            [
                Problem(
                    filename,
                    1,
                    1,
                    "",
                    _json_safe(data),
                    "the fleet file must be a mapping",
                    _MINIMAL_FIX,
                )
            ],
        )
    # Top-level `x-…` keys hold YAML anchors for reuse (as in docker compose); not settings.
    data = {key: value for key, value in data.items() if not str(key).startswith("x-")}
    try:
        return FleetSpec.model_validate(data, context={"base_dir": base.absolute()})
    except ValidationError as exc:
        raise FleetValidationError(filename, _problems(exc, index, filename)) from None


_MINIMAL_FIX = 'start with models: [{name: m, endpoints: ["http://127.0.0.1:8100"]}]'


def _problems(exc: ValidationError, index: PositionIndex, filename: str) -> list[Problem]:
    problems = []
    for item in explain(exc.errors(), FleetSpec):
        position = index.find(item.loc, prefer_key=item.at_key)
        problems.append(
            Problem(
                file=filename,
                line=position.line,
                column=position.column,
                field=format_loc(item.loc),
                value=_json_safe(item.value),
                message=item.message,
                fix=item.fix,
            )
        )
    # In file order, so the report reads top to bottom.
    return sorted(problems, key=lambda p: (p.line or 0, p.column or 0))


def _file_error(filename: str, message: str, fix: str) -> FleetValidationError:
    return FleetValidationError(filename, [Problem(filename, None, None, "", None, message, fix)])


def _json_safe(value: Any) -> Any:
    """Values as written in YAML, made JSON-safe for `validate --json`."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, datetime.date):
        return value.isoformat()
    return repr(value)
