"""Who may see the console: the gateway's admin token, as the admin API checks it.

The rule (docs/console.md):
- a gateway without tenancy, or with tenancy but neither API keys in force nor an admin
  token configured, serves the console openly: the gateway itself is open then;
- otherwise every request needs the admin token (`gateway.admin_token_env`, by default
  $INFERPLANE_ADMIN_TOKEN): `Authorization: Bearer TOKEN` (what `/admin/` takes), or the
  session cookie the login form sets, which holds an HMAC of the token, never the token;
- auth is on but no admin token is configured: refused (403) naming the variable to set.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from inferplane.tenancy.service import Tenancy

COOKIE = "inferplane_console"
Verdict = Literal["open", "ok", "missing", "disabled"]


def session_value(token: str) -> str:
    """The cookie's value for `token`: changes when the token changes, reveals nothing."""
    return hmac.new(token.encode(), b"inferplane-console-session", hashlib.sha256).hexdigest()


def _cookie(headers: Iterable[tuple[bytes, bytes]]) -> str:
    for name, value in headers:
        if name == b"cookie":
            for part in value.decode("latin-1").split(";"):
                key, _, val = part.strip().partition("=")
                if key == COOKIE:
                    return val
    return ""


def bearer(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """The token of an `Authorization: Bearer ...` header (parsed as the admin API does)."""
    for name, value in headers:
        if name == b"authorization":
            return value.partition(b" ")[2].strip()
    return b""


def protected(tenancy: Tenancy | None) -> bool:
    return tenancy is not None and (tenancy.auth_required or bool(tenancy.admin_token))


def check(tenancy: Tenancy | None, headers: Iterable[tuple[bytes, bytes]]) -> Verdict:
    """"open" (no auth in force), "ok" (the admin token or its cookie), "missing" (401),
    "disabled" (auth is on but no admin token is configured: 403)."""
    if tenancy is None or not protected(tenancy):
        return "open"
    token = tenancy.admin_token
    if not token:
        return "disabled"
    headers = list(headers)
    if hmac.compare_digest(bearer(headers), token.encode()):
        return "ok"
    if hmac.compare_digest(_cookie(headers).encode(), session_value(token).encode()):
        return "ok"
    return "missing"
