"""Accept: the request's head read in one pass over its headers, and its body, bounded.

Everything later stages need from the headers is picked up here, once: the request id,
the Authorization header, Content-Length, the priority class, the client's trace context
(passed on unchanged when the gateway itself does not trace) and the replica-header grant.
"""

from __future__ import annotations

import itertools
import os

from inferplane.gateway.admission import BATCH, INTERACTIVE
from inferplane.gateway.asgi import Receive
from inferplane.gateway.errors import ClientError
from inferplane.gateway.replica_header import TOKEN_HEADER, ReplicaHeader

MAX_REQUEST_ID = 128  # a longer x-request-id is replaced by the gateway's own


class RequestIds:
    """Request ids unique across gateway processes: a random prefix and a counter."""

    def __init__(self) -> None:
        self._prefix = os.urandom(4).hex() + "-"
        self._seq = itertools.count(1)

    def next(self) -> bytes:
        return (self._prefix + str(next(self._seq))).encode()


class Head:
    """What the gateway reads from a request's headers."""

    __slots__ = ("auth", "length", "priority", "rid", "show_replica", "trace_headers")

    def __init__(self) -> None:
        self.rid = b""
        self.auth: bytes | None = None
        self.length: bytes | None = None
        self.priority = INTERACTIVE
        self.trace_headers = b""  # `traceparent`/`tracestate` lines for the engine
        self.show_replica = False


class Acceptor:
    """Reads heads and bodies with the gateway's settings (priority header, body limit)."""

    def __init__(
        self, priority_header: str, replica_header: ReplicaHeader, max_body_bytes: int
    ) -> None:
        self.priority_header = priority_header.lower().encode()
        self.replica_header = replica_header
        self.max_body_bytes = max_body_bytes
        self.ids = RequestIds()

    def head(self, headers: list[tuple[bytes, bytes]], traced: bool) -> Head:
        """One pass over the headers; `traced`: the gateway's tracing makes the context."""
        head = Head()
        rid: bytes | None = None
        priority_header = self.priority_header
        show_replica = self.replica_header.always
        trace_headers = b""
        for name, value in headers:
            if name == b"content-length":
                head.length = value
            elif name == b"x-request-id":
                rid = value if 0 < len(value) <= MAX_REQUEST_ID else None
            elif name == b"authorization":
                head.auth = value
            elif name == priority_header:
                head.priority = BATCH if value.lower() == b"batch" else INTERACTIVE
            elif (name == b"traceparent" or name == b"tracestate") and not traced:
                trace_headers += name + b": " + value + b"\r\n"  # passed on unchanged
            elif name == TOKEN_HEADER:
                show_replica = show_replica or self.replica_header.granted(value)
        head.rid = rid if rid is not None else self.ids.next()
        head.trace_headers = trace_headers
        head.show_replica = show_replica
        return head

    async def body(self, receive: Receive, length: bytes | None) -> bytes:
        """The whole body, refused with a 413 as soon as it is known to exceed the limit."""
        limit = self.max_body_bytes
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                raise ClientError(400, "Content-Length is not a number") from None
            if declared > limit:
                raise ClientError(413, self.too_large())
        message = await receive()
        body: bytes = message.get("body", b"")
        if not message.get("more_body", False):
            if len(body) > limit:
                raise ClientError(413, self.too_large())
            return body
        chunks = [body]
        size = len(body)
        while message.get("more_body", False):
            message = await receive()
            if message["type"] != "http.request":
                raise ClientError(400, "client closed the connection while sending the body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise ClientError(413, self.too_large())
            chunks.append(chunk)
        return b"".join(chunks)

    def too_large(self) -> str:
        limit = self.max_body_bytes
        return f"request body exceeds the gateway limit of {limit} bytes ({limit / 2**20:g} MiB)"
