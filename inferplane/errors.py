"""User-facing errors.

Every error a user can cause names what was wrong (field, value) and how to fix it.
The CLI prints these without a traceback and exits with code 2.
"""

from __future__ import annotations

from typing import Any

USAGE_EXIT_CODE = 2


class InferplaneError(Exception):
    """A problem with the user's input or environment that they can fix."""

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        value: Any = None,
        fix: str | None = None,
        location: str | None = None,
    ) -> None:
        self.message = message
        self.field = field
        self.value = value
        self.fix = fix
        self.location = location
        super().__init__(self.render())

    def render(self) -> str:
        parts: list[str] = []
        if self.location:
            parts.append(f"{self.location}: ")
        if self.field:
            parts.append(f"{self.field}: ")
        parts.append(self.message)
        if self.value is not None:
            parts.append(f" (got {self.value!r})")
        if self.fix:
            parts.append(f". Fix: {self.fix}")
        return "".join(parts)
