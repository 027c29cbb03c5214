"""Model names as clients send them: bounded and printable before anything stores them.

A name is written to the usage ledger, the access log, metrics labels and the console, so
the gateway never passes a client's raw string on: a name over `MAX_MODEL_NAME` characters
or with a control character (a NUL that PostgreSQL refuses, a newline that forges log
lines) is a 400, and a well-formed name the fleet does not serve is recorded as
`UNKNOWN_MODEL`, one bucket however many typos arrive.
"""

from __future__ import annotations

import re

from inferplane.gateway.errors import ClientError

MAX_MODEL_NAME = 256  # Hugging Face ids are at most 96; a served name or alias is shorter
UNKNOWN_MODEL = "-"  # usage, metrics and logs: a name that matches no model, alias or route
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def check_model_name(model: str) -> None:
    """Raise a 400 for a name no fleet could serve (too long, control characters)."""
    if len(model) > MAX_MODEL_NAME:
        raise ClientError(
            400,
            f"'model' is {len(model)} characters long, above the limit of {MAX_MODEL_NAME}; "
            "use a name from GET /v1/models",
            "model",
        )
    if _CONTROL.search(model) is not None:
        raise ClientError(
            400, "'model' contains a control character; use a name from GET /v1/models",
            "model",
        )  # fmt: skip
