"""What the gateway checks in a `/v1/responses` body before it reaches vLLM.

- `background`: work that outlives its request holds no gateway slot, no timeout bounds it
  and its tokens never reach the usage ledger, so it is refused. vLLM's pydantic model
  reads `true`, `1`, `"yes"`, `"on"` ... as true (lax bool parsing), so the check parses
  the field the same way instead of testing `is True`.
- `request_id`: vLLM uses a client-set `request_id` as the response's id, so one key could
  pick another key's id and overwrite, read or continue that response. The gateway puts
  every client-set id in the caller's own namespace (`resp_<key hash>-<id>`); ids vLLM
  makes itself are random.
"""

from __future__ import annotations

import hashlib
from typing import Any

from inferplane.gateway.errors import ClientError

# pydantic v2's lax bool parsing (what vLLM's ResponsesRequest.background goes through).
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})
MAX_REQUEST_ID = 128


def lax_bool(value: Any) -> bool | None:
    """`value` as pydantic reads a bool field: True, False, or None (pydantic refuses it)."""
    if type(value) is bool:
        return value
    if type(value) in (int, float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
    return None


def stores_response(data: dict[str, Any]) -> bool:
    """Whether vLLM keeps this response (`store` defaults to true, read as pydantic does):
    an id it does not keep is not worth remembering (and would evict ones it keeps)."""
    store = data.get("store")
    return store is None or lax_bool(store) is not False


def key_namespace(key_id: str | None) -> str:
    """A short, stable prefix per key (anonymous callers share one)."""
    return hashlib.sha256(("key:" + (key_id or "")).encode()).hexdigest()[:12]


def guard_responses_body(data: dict[str, Any], key_id: str | None) -> bool:
    """Refuse background work and scope a client-set `request_id` to the caller's key.
    Returns whether `data` changed (the body must be re-encoded)."""
    background = data.get("background")
    if background is not None:
        parsed = lax_bool(background)
        if parsed is None:
            raise ClientError(400, "'background' must be a boolean", "background")
        if parsed:
            raise ClientError(
                400,
                "'background' responses are not served through the gateway (their tokens "
                "would go unbilled and unbounded by its limits); use stream=true instead",
                "background",
            )
    request_id = data.get("request_id")
    if request_id is None:
        return False
    if type(request_id) is not str or not 0 < len(request_id) <= MAX_REQUEST_ID:
        raise ClientError(
            400, f"'request_id' must be a string of 1 to {MAX_REQUEST_ID} characters",
            "request_id",
        )  # fmt: skip
    data["request_id"] = f"resp_{key_namespace(key_id)}-{request_id}"
    return True
