"""The native protocol's entry for the proxied routes (`GatewayApp.native_entry`): a POST
to a model path reaches it without a scope, everything else (and an app without one)
goes through ASGI, and the bytes on the wire are the same either way."""

from __future__ import annotations

import asyncio
from typing import Any

from test_gateway_h1 import FakeTransport

from inferplane.gateway.asgi import NativeEntry, Receive, Scope, Send, respond
from inferplane.gateway.connections import Connections
from inferplane.gateway.h1 import protocol_for

CHAT = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer k\r\n"
    b'Content-Length: 13\r\n\r\n{"model":"m"}'
)


class App:
    """Answers with where the request arrived; `native`: whether it offers the entry."""

    def __init__(self, native: bool) -> None:
        self.native = native
        self.seen: list[tuple[str, str, list[tuple[bytes, bytes]], bytes]] = []
        self.tasks: list[asyncio.Task[Any] | None] = []

    def native_entry(self) -> NativeEntry | None:
        return self._native if self.native else None

    async def _native(
        self, path: str, headers: list[tuple[bytes, bytes]], receive: Receive, send: Send,
        conn: Any,
    ) -> None:  # fmt: skip
        self.tasks.append(asyncio.current_task())
        await self._answer("native", path, headers, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._answer("asgi", scope["path"], scope["headers"], receive, send)

    async def _answer(
        self, via: str, path: str, headers: list[tuple[bytes, bytes]], receive: Receive,
        send: Send,
    ) -> None:  # fmt: skip
        message = await receive()
        self.seen.append((via, path, list(headers), message["body"]))
        await respond(send, 200, b'{"ok":true}', b"rid-1", extra=[(b"x-a", b"1")])


def _serve(app: App, data: bytes, paused: bool = False, later: bytes = b"") -> FakeTransport:
    async def run() -> FakeTransport:
        proto = protocol_for(Connections(), app, None)()
        transport = FakeTransport()
        proto.connection_made(transport)
        if paused:
            proto.pause_writing()
        proto.data_received(data)
        for _ in range(20):
            await asyncio.sleep(0)
        if later:  # in a read after the first answers
            proto.data_received(later)
            for _ in range(20):
                await asyncio.sleep(0)
        if paused:
            assert transport.out == b""  # respond waits for the drain, as send() does
            proto.resume_writing()
            for _ in range(20):
                await asyncio.sleep(0)
        proto.connection_lost(None)
        proto.guard.close()
        return transport

    return asyncio.run(run())


def test_a_proxied_post_takes_the_native_entry_with_the_same_bytes() -> None:
    native, plain = App(native=True), App(native=False)
    out = _serve(native, CHAT).out
    assert out == _serve(plain, CHAT).out
    assert out.startswith(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n")
    assert out.endswith(b'x-request-id: rid-1\r\nx-a: 1\r\n\r\n{"ok":true}')
    assert [s[0] for s in native.seen] == ["native"]
    assert [s[0] for s in plain.seen] == ["asgi"]
    assert native.seen[0][1:] == plain.seen[0][1:]  # path, headers, body


def test_other_requests_stay_on_asgi() -> None:
    app = App(native=True)
    query = CHAT.replace(b"completions HTTP", b"completions?x=1 HTTP")
    get = b"GET /v1/chat/completions HTTP/1.1\r\nHost: t\r\n\r\n"
    other = CHAT.replace(b"/v1/chat/completions", b"/v1/models")
    for data in (query, get, other):
        assert _serve(app, data).out.startswith(b"HTTP/1.1 200 OK")
    assert [s[0] for s in app.seen] == ["asgi", "asgi", "asgi"]


def test_a_paused_transport_sends_the_whole_answer_after_the_drain() -> None:
    app = App(native=True)
    assert _serve(app, CHAT, paused=True).out == _serve(App(native=True), CHAT).out


def test_a_connections_native_requests_share_its_one_task_and_keep_their_order() -> None:
    app = App(native=True)
    other = CHAT.replace(b"/v1/chat/completions", b"/v1/models")
    # two in one read (pipelined), a non-native one between, then one more
    out = _serve(app, CHAT + CHAT, later=other + CHAT).out
    assert out.count(b"HTTP/1.1 200 OK") == 4
    assert [s[0] for s in app.seen] == ["native", "native", "asgi", "native"]
    assert len(app.tasks) == 3 and len(set(map(id, app.tasks))) == 1


def test_the_connections_task_ends_with_the_connection() -> None:
    async def run() -> tuple[int, int]:
        app = App(native=True)
        cls = protocol_for(Connections(), app, None)
        proto = cls()
        proto.connection_made(FakeTransport())
        proto.data_received(CHAT)
        for _ in range(20):
            await asyncio.sleep(0)
        live = len(cls.tasks)  # idle between requests: still there for the next one
        proto.connection_lost(None)
        for _ in range(5):
            await asyncio.sleep(0)
        proto.guard.close()
        return live, len(cls.tasks)

    assert asyncio.run(run()) == (1, 0)
