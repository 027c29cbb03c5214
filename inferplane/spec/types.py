"""Field types shared by the fleet-file models, each with one clear error and fix.

They use plain validators (not unions) so a bad value gets exactly one error that says what
is accepted, instead of one error per union member.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import Field, PlainValidator, StrictStr
from pydantic_core import PydanticCustomError

from inferplane.spec.problems import Issue, issues_error

Auto = Literal["auto"]

PositiveInt = Annotated[int, Field(strict=True, gt=0)]
NonNegativeInt = Annotated[int, Field(strict=True, ge=0)]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_KILO = re.compile(r"\s*(\d+)\s*[kK]\s*")  # "8k": a length written as people say it


def _auto_or_positive_int(value: Any) -> int | str:
    if value == "auto" or (_is_int(value) and value > 0):
        return value
    kilo = _KILO.fullmatch(value) if isinstance(value, str) else None
    fix = (f'write the number itself: {int(kilo[1]) * 1024} ("k" is not read), or "auto"'
           if kilo else 'use a whole number >= 1 (e.g. 2) or "auto" to let the planner choose')
    raise PydanticCustomError(
        "auto_or_positive_int", 'must be a positive integer or "auto"', {"fix": fix}
    )


AutoOrPositiveInt = Annotated[int | Auto, PlainValidator(_auto_or_positive_int)]


def _auto_or_fraction(value: Any) -> float | str:
    if value == "auto":
        return "auto"
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        if 0 < value <= 1:
            return float(value)
        fix = 'use a fraction of the whole card in (0, 1], e.g. 0.9, or "auto"'
        if 10 <= value <= 100:
            fix += f" (a percentage of {value:g} is written {value / 100:g})"
        raise PydanticCustomError("fraction_range", "must be in (0, 1]", {"fix": fix})
    raise PydanticCustomError(
        "auto_or_fraction",
        'must be a number in (0, 1] or "auto"',
        {"fix": 'use a fraction of the whole card such as 0.9, or "auto"'},
    )


AutoOrFraction = Annotated[float | Auto, PlainValidator(_auto_or_fraction)]


def _fraction(value: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 1:
        return float(value)
    raise PydanticCustomError(
        "fraction", "must be a number in (0, 1]", {"fix": "use a fraction such as 0.8"}
    )


Fraction = Annotated[float, PlainValidator(_fraction)]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _env_map(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise PydanticCustomError(
            "env_map",
            "must be a mapping of NAME: value",
            {"fix": 'write e.g. {VLLM_LOGGING_LEVEL: "INFO"}'},
        )
    issues: list[Issue] = []
    for key, item in value.items():
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            issues.append(
                Issue(
                    (str(key),),
                    "environment variable name is not valid",
                    key,
                    "use letters, digits and '_', not starting with a digit",
                )
            )
        elif not isinstance(item, str):
            # YAML reads 1 / true as a number / boolean; the process needs the exact text.
            issues.append(
                Issue(
                    (key,),
                    "environment variable value must be a string",
                    item,
                    f'quote the value: {key}: "{_yaml_scalar(item)}"',
                )
            )
    if issues:
        raise issues_error(issues)
    return dict(value)


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


EnvMap = Annotated[dict[str, str], PlainValidator(_env_map)]

Labels = dict[StrictStr, StrictStr]

_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[A-Za-z0-9.]+)?$")


def _version(value: Any) -> str:
    if isinstance(value, str) and _VERSION.match(value):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise PydanticCustomError(
            "version_unquoted",
            "version must be a quoted string",
            {"fix": 'quote it, e.g. version: "0.11.0" (YAML reads an unquoted 0.10 as 0.1)'},
        )
    raise PydanticCustomError(
        "version",
        "is not a version number",
        {"fix": 'use a release such as "0.11.0" (PEP 440: "0.11.0rc1", "0.10.1.post1" work)'},
    )


Version = Annotated[str, PlainValidator(_version)]
