"""ASGI types and the two helpers every gateway route uses: read a header, answer a body.

One module so the gateway, tenancy's admin API, the console and the activator agree on the
shapes (raw ASGI on purpose: a framework's request/response objects would be a large share
of a few hundred microseconds per request).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# The gateway's own protocol's entry for the proxied routes (`GatewayApp.native_entry`):
# path, the parsed head's headers, receive, send, the connection (for `on_lost`).
NativeEntry = Callable[[str, list[tuple[bytes, bytes]], Receive, Send, Any], Awaitable[None]]

JSON = b"application/json"
JSON_HEADER = (b"content-type", JSON)


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of header `name` (lower-case bytes), or None."""
    return find_header(scope["headers"], name)


def find_header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """`header` on a head's header pairs."""
    for key, value in headers:
        if key == name:
            return bytes(value)
    return None


class DirectSend:
    """A send that can also take a whole answer in one call (`h1cycle.Request`): `respond`
    then builds no messages and awaits nothing."""

    __slots__ = ()

    def whole(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        """Answer at once; False: not now, send the two messages instead."""
        return False


async def respond(
    send: Send,
    status: int,
    body: bytes,
    rid: bytes = b"",
    content_type: bytes = JSON,
    extra: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    """A whole response in two messages; `rid` (when set) as x-request-id."""
    headers = [(b"content-type", content_type), (b"content-length", b"%d" % len(body))]
    if rid:
        headers.append((b"x-request-id", rid))
    if extra:
        headers.extend(extra)
    if isinstance(send, DirectSend) and send.whole(status, headers, body):
        return
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
