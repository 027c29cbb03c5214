"""The most tokens a request may generate, reserved against its key's budget and TPM.

Admission once charged only the prompt estimate, so 20 concurrent requests with
`max_tokens: 300` all fitted a 2,000-token budget and used 4× it, and one `n: 8` request
passed a 2,000 TPM limit. The gateway now reserves `n × max_tokens` (after the model's
`max_tokens_cap`; the cap itself when the request names no limit) at admission and settles
with the engine's usage when the request ends. A request naming no limit on a model without
a cap reserves only its prompt: set `max_tokens_cap` where budgets must hold exactly.
"""

from __future__ import annotations

from typing import Any

from inferplane.gateway.routes import GENERATION_LIMITS

MAX_CHOICES = 128  # beyond any real `n`; a larger value is vLLM's to refuse


def _count(data: dict[str, Any], name: str) -> int:
    value = data.get(name)
    return value if type(value) is int and 1 <= value <= MAX_CHOICES else 1


def output_reservation(data: dict[str, Any], path: str, cap: int | None) -> int:
    """n × the request's output limit (clamped to `cap`), or n × `cap` when it names none."""
    fields = GENERATION_LIMITS.get(path)
    if fields is None:
        return 0
    asked: int | None = None
    for name in fields:
        value = data.get(name)
        if type(value) is int and value >= 0:
            asked = value if asked is None else min(asked, value)
    if asked is None:
        asked = cap or 0
    elif cap is not None:
        asked = min(asked, cap)
    # `best_of` candidates are generated too (completions); billed as `n` when larger.
    return max(_count(data, "n"), _count(data, "best_of")) * asked
