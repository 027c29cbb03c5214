"""Who may see the console: the gateway's admin token, as the admin API checks it.

The rule (docs/console.md):
- a gateway without tenancy, or with tenancy but neither API keys in force nor an admin
  token configured, serves the console openly: the gateway itself is open then;
- otherwise every request needs the admin token (`gateway.admin_token_env`, by default
  $INFERPLANE_ADMIN_TOKEN): `Authorization: Bearer TOKEN` (what `/admin/` takes), or the
  session cookie the login form sets: `EXPIRY.NONCE.HMAC(token, EXPIRY.NONCE)`, never the
  token. A session ends after `SESSION_TTL_S`, at sign-out (its nonce is revoked in this
  gateway process) and when the token changes; sign-in failures are throttled per client
  and overall (`LoginThrottle`);
- auth is on but no admin token is configured: refused (403) naming the variable to set.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from inferplane.tenancy.service import Tenancy

COOKIE = "inferplane_console"
Verdict = Literal["open", "ok", "missing", "disabled"]


SESSION_TTL_S = 12 * 3600


def _sign(token: str, payload: str) -> str:
    return hmac.new(token.encode(), b"inferplane-console-session:" + payload.encode(),
                    hashlib.sha256).hexdigest()  # fmt: skip


class Sessions:
    """Console sign-ins of one gateway process: issued with an expiry, revocable."""

    def __init__(self, ttl_s: float = SESSION_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._revoked: dict[str, float] = {}  # nonce -> its expiry (then forgotten)

    def issue(self, token: str, now: float | None = None) -> str:
        expiry = int((time.time() if now is None else now) + self.ttl_s)
        payload = f"{expiry}.{secrets.token_hex(16)}"
        return f"{payload}.{_sign(token, payload)}"

    def valid(self, token: str, value: str, now: float | None = None) -> bool:
        expiry, _, rest = value.partition(".")
        nonce, _, mac = rest.partition(".")
        if not (expiry.isdigit() and nonce and mac):
            return False
        if not hmac.compare_digest(mac.encode(), _sign(token, f"{expiry}.{nonce}").encode()):
            return False
        now = time.time() if now is None else now
        return int(expiry) > now and nonce not in self._revoked

    def revoke(self, value: str, now: float | None = None) -> None:
        """Sign-out: this session's cookie no longer opens the console."""
        expiry, _, rest = value.partition(".")
        nonce = rest.partition(".")[0]
        if expiry.isdigit() and nonce:
            now = time.time() if now is None else now
            self._revoked = {n: e for n, e in self._revoked.items() if e > now}
            self._revoked[nonce] = float(expiry)


class LoginThrottle:
    """At most `per_client` failed sign-ins per client address and `overall` in all per
    `window_s`; beyond, sign-in answers 429 until the window has room again."""

    def __init__(self, per_client: int = 5, overall: int = 30, window_s: float = 60.0) -> None:
        self.per_client, self.overall, self.window_s = per_client, overall, window_s
        self._failures: deque[tuple[float, str]] = deque()

    def _prune(self, now: float) -> None:
        while self._failures and self._failures[0][0] <= now - self.window_s:
            self._failures.popleft()

    def retry_after(self, client: str, now: float | None = None) -> float:
        """Seconds until `client` may try again (0: now)."""
        now = time.monotonic() if now is None else now
        self._prune(now)
        mine = [t for t, c in self._failures if c == client]
        if len(mine) >= self.per_client:
            return mine[-self.per_client] + self.window_s - now
        if len(self._failures) >= self.overall:
            return self._failures[-self.overall][0] + self.window_s - now
        return 0.0

    def failed(self, client: str, now: float | None = None) -> None:
        self._failures.append((time.monotonic() if now is None else now, client))


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


def session_cookie(headers: Iterable[tuple[bytes, bytes]]) -> str:
    return _cookie(headers)


def check(
    tenancy: Tenancy | None, headers: Iterable[tuple[bytes, bytes]],
    sessions: Sessions | None = None,
) -> Verdict:  # fmt: skip
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
    cookie = _cookie(headers)
    if cookie and sessions is not None and sessions.valid(token, cookie):
        return "ok"
    return "missing"
