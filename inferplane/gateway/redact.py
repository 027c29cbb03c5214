"""Credentials never printed: URLs are shown with their password (and secret-looking query
parameters) replaced by `***`, in banners, logs, error messages and metric labels."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

_SECRET_PARAMS = ("password", "passwd", "pwd", "secret", "token", "key", "auth")


def redact_url(url: str) -> str:
    """`url` with its credentials masked: `postgresql://u:***@db/x`, `redis://:***@h`."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "***"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user, sep, _password = userinfo.partition(":")
        # A user alone may be a token (https://TOKEN@host): masked as well.
        netloc = f"{user}:***@{host}" if sep else f"***@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(_looks_secret(k) for k, _ in pairs):
            query = urlencode([(k, "***" if _looks_secret(k) else v) for k, v in pairs], safe="*")
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _looks_secret(name: str) -> bool:
    lower = name.lower()
    return any(word in lower for word in _SECRET_PARAMS)
