"""DNS rebinding: which `Host` (and `Origin`) an open console answers to.

An open console (no auth in force, docs/console.md) trusts whoever reaches it. A web page
on `rebind.attacker.example` can re-point its own name at 127.0.0.1; the browser then sends
that page's requests, headers and all, to the console as same-origin requests. Only the
`Host` header tells them apart: it carries the attacker's name. So an open console answers
only to loopback names and the hosts listed in `gateway.console_allowed_hosts`, and an
action's `Origin`, when sent, must name one of them too. A console behind the admin token
accepts any Host: a rebound page has neither the token nor its cookie.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})


def host_name(value: str) -> str:
    """'Example.COM:8000' -> 'example.com', '[::1]:8000' -> '::1'."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    if value.count(":") == 1:
        value = value.partition(":")[0]
    return value.rstrip(".")


def allowed(name: str, extra: Iterable[str]) -> bool:
    if name in LOOPBACK or name.endswith(".localhost") or name.startswith("127."):
        return True
    return any(h == "*" or host_name(h) == name for h in extra)


def rebinding_refusal(
    headers: Iterable[tuple[bytes, bytes]], extra: Iterable[str]
) -> str | None:
    """Why a request to the open console is refused (a foreign Host or Origin), or None."""
    extra = tuple(extra)
    host = origin = None
    for name, value in headers:
        if name == b"host":
            host = value.decode("latin-1")
        elif name == b"origin":
            origin = value.decode("latin-1")
    if host is not None and not allowed(host_name(host), extra):
        return f"Host {host_name(host)!r}"
    if origin is not None and origin != "null":
        origin_host = urlsplit(origin).hostname or ""
        if not allowed(origin_host.lower(), extra):
            return f"Origin {origin!r}"
    return None
