"""`routes:` (weighted splits between models, e.g. a 5% canary, P43) and `limits:` (P38)."""

from __future__ import annotations

from pydantic import Field, StrictStr, model_validator

from inferplane.spec.base import SpecModel
from inferplane.spec.problems import Issue, issues_error
from inferplane.spec.types import NonNegativeInt, PositiveInt


class RouteBackend(SpecModel):
    """One target of a route and its relative weight (weights need not sum to 100)."""

    target: StrictStr  # a model name from `models:`
    weight: NonNegativeInt


class RouteSpec(SpecModel):
    """Requests for `model` are split across `backends` in proportion to their weights."""

    model: StrictStr  # a model name from `models:` (the name clients send)
    backends: list[RouteBackend] = Field(min_length=1)

    @model_validator(mode="after")
    def _backends(self) -> RouteSpec:
        issues: list[Issue] = []
        seen: set[str] = set()
        for index, backend in enumerate(self.backends):
            if backend.target in seen:
                issues.append(
                    Issue(
                        ("backends", index, "target"),
                        "target is listed twice in this route",
                        backend.target,
                        "merge the two entries into one weight",
                    )
                )
            seen.add(backend.target)
        if not issues and sum(b.weight for b in self.backends) == 0:
            issues.append(
                Issue(
                    ("backends",),
                    "all weights are 0, so no request could be routed",
                    [b.weight for b in self.backends],
                    "give at least one backend a weight above 0",
                )
            )
        if issues:
            raise issues_error(issues)
        return self

    def shares(self) -> dict[str, float]:
        """Each target's fraction of the traffic (sums to 1)."""
        total = sum(b.weight for b in self.backends)
        return {b.target: b.weight / total for b in self.backends}


class KeyLimits(SpecModel):
    """Limits per API key. Unset means unlimited."""

    rpm: PositiveInt | None = None  # requests per minute
    tpm: PositiveInt | None = None  # tokens (prompt + completion) per minute
    max_concurrent: PositiveInt | None = None  # requests in flight at once (P38)


class LimitsSpec(SpecModel):
    """Default limits; keys created in the store may override them."""

    per_key: KeyLimits = Field(default_factory=KeyLimits)
