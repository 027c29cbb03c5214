"""What the fleet loader reports: one `Problem` per mistake, all raised together.

Validators inside the models that want to point at a precise sub-field (not just the model
they run on) raise `issues_error(...)` with `Issue`s; the loader expands them into
`Problem`s with file:line so the user sees every mistake at once, where it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic_core import PydanticCustomError

from inferplane.errors import InferplaneError

Loc = tuple[str | int, ...]

# The pydantic error type that carries a list of `Issue`s in its context.
ISSUES_ERROR_TYPE = "fleet_issues"


@dataclass(frozen=True)
class Issue:
    """A mistake found by a validator, located relative to the model that found it."""

    loc: Loc  # relative path, e.g. ("placement", "colocate_with", 0)
    message: str
    value: Any = None
    fix: str | None = None


def issues_error(issues: Sequence[Issue]) -> PydanticCustomError:
    """One pydantic error that carries several located issues (a validator can raise one)."""
    summary = "; ".join(f"{format_loc(i.loc) or '.'}: {i.message}" for i in issues)
    return PydanticCustomError(
        ISSUES_ERROR_TYPE, "{summary}", {"summary": summary, "issues": tuple(issues)}
    )


def format_loc(loc: Loc) -> str:
    """`("models", 1, "tensor_parallel_size")` -> `models[1].tensor_parallel_size`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


@dataclass(frozen=True)
class Problem:
    """One mistake in a fleet file, with where it is and how to fix it."""

    file: str
    line: int | None  # 1-based; None when the file could not be read at all
    column: int | None  # 1-based
    field: str  # e.g. "models[1].tensor_parallel_size"; "" for the whole file
    value: Any  # the offending value as written (JSON-safe)
    message: str
    fix: str | None

    @property
    def location(self) -> str:
        if self.line is None:
            return self.file
        return f"{self.file}:{self.line}:{self.column}"

    def render(self) -> str:
        parts = [f"{self.location}: "]
        if self.field:
            parts.append(f"{self.field}: ")
        parts.append(self.message)
        if self.value is not None:
            parts.append(f" (got {_short_repr(self.value)})")
        if self.fix:
            parts.append(f". Fix: {self.fix}")
        return "".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "line": self.line,
            "column": self.column,
            "field": self.field,
            "value": self.value,
            "message": self.message,
            "fix": self.fix,
        }


def _short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class FleetValidationError(InferplaneError):
    """A fleet file with one or more problems; `.problems` lists each with file:line."""

    def __init__(self, file: str, problems: Sequence[Problem]) -> None:
        self.file = file
        self.problems: tuple[Problem, ...] = tuple(problems)
        first = self.problems[0]
        super().__init__(
            f"{len(self.problems)} problem(s) in the fleet file",
            field=first.field or None,
            value=first.value,
            fix=first.fix,
            location=first.location,
        )

    def render(self) -> str:
        count = len(self.problems)
        noun = "problem" if count == 1 else "problems"
        lines = [f"{self.file}: {count} {noun}"]
        lines.extend(f"  {p.render()}" for p in self.problems)
        return "\n".join(lines)
