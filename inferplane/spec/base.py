"""The base every fleet-file model shares: unknown keys are errors, no silent coercion."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class SpecModel(BaseModel):
    """Strict (a quoted "2" is not an int, `true` is not 1) and closed (unknown keys fail)."""

    model_config = ConfigDict(extra="forbid", strict=True)
