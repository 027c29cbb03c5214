"""The gateway's own HTTP/1.1 protocol (`gateway/h1.py`) on raw sockets: pipelining,
chunked bodies, 100-continue, HTTP/1.0, malformed requests, a client gone mid-stream,
back-pressure; and that any split of the byte stream parses to the same requests."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferplane.gateway.asgi import Receive, Scope, Send
from inferplane.gateway.config import ConnectionLimits
from inferplane.gateway.connections import CONNECTION, Connections
from inferplane.gateway.h1 import protocol_for
from inferplane.gateway.h1server import NativeServer, StartupFailed


class EchoApp:
    """Answers every request with what it received; /stream streams until the client
    goes and records how the app learned of it."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.lifespan: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                self.lifespan.append(message["type"])
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["path"] == "/early":  # answers without reading the body (like a 413)
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", b"2")]})  # fmt: skip
            await send({"type": "http.response.body", "body": b"no"})
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if scope["path"] == "/stream":
            await self._stream(scope, receive, send)
            return
        answer = json.dumps({
            "method": scope["method"], "path": scope["path"], "version": scope["http_version"],
            "query": scope["query_string"].decode(), "body": body.decode(),
        }).encode()  # fmt: skip
        headers = [(b"content-type", b"application/json")]
        if scope["path"] != "/no-length":
            headers.append((b"content-length", b"%d" % len(answer)))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})

    async def _stream(self, scope: Scope, receive: Receive, send: Send) -> None:
        lost = asyncio.Event()
        scope[CONNECTION].on_lost = lost.set
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})  # fmt: skip
        while not lost.is_set():
            await send({"type": "http.response.body", "body": b"data: x\n\n", "more_body": True})
            await asyncio.sleep(0.005)
        self.events.append("on_lost")
        if (await receive())["type"] == "http.disconnect":
            self.events.append("http.disconnect")


class Served:
    def __init__(self) -> None:
        self.app = EchoApp()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.connections = Connections(ConnectionLimits(header_timeout_s=5, body_timeout_s=5))
        self.server = NativeServer(self.app, "127.0.0.1", 0, self.connections)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.addr = sock.getsockname()
        self.task = asyncio.run_coroutine_threadsafe(self.server.serve([sock]), self.loop)
        while not self.server.started:
            time.sleep(0.01)

    def close(self) -> None:
        self.server.should_exit = True
        self.task.result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    s = Served()
    yield s
    s.close()
    assert s.app.lifespan == ["lifespan.startup", "lifespan.shutdown"]


def talk(served: Served, data: bytes, until_closed: bool = False) -> bytes:
    with socket.create_connection(served.addr, timeout=5) as sock:
        sock.sendall(data)
        got = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return got
            got += chunk
            if not until_closed and got.count(b"\r\n\r\n") and _complete(got):
                return got


def _complete(got: bytes) -> bool:
    head, _, body = got.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def answers(data: bytes) -> list[dict[str, Any]]:
    """The JSON bodies of consecutive Content-Length responses."""
    out = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))  # fmt: skip
        out.append(json.loads(rest[:length]))
        data = rest[length:]
    return out


def post(path: bytes, body: bytes, extra: bytes = b"") -> bytes:
    return (b"POST %s HTTP/1.1\r\nHost: t\r\n%bContent-Length: %d\r\n\r\n%b"
            % (path, extra, len(body), body))  # fmt: skip


def test_pipelined_requests_are_answered_in_order(served: Served) -> None:
    data = post(b"/a", b"one") + post(b"/b?x=1", b"two") + b"GET /c HTTP/1.1\r\nHost: t\r\n"
    data += b"Connection: close\r\n\r\n"
    got = answers(talk(served, data, until_closed=True))
    assert [(a["path"], a["query"], a["body"]) for a in got] == [
        ("/a", "", "one"), ("/b", "x=1", "two"), ("/c", "", "")]  # fmt: skip


def test_a_body_the_app_never_read_is_skipped_and_the_next_request_answered(
    served: Served,
) -> None:
    big = b"x" * 300_000  # over the read-pause mark: never buffered, never a stall
    with socket.create_connection(served.addr, timeout=5) as sock:
        sock.sendall(b"POST /early HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(big))
        got = b""
        while not _complete(got):
            got += sock.recv(65536)
        assert got.endswith(b"\r\n\r\nno")
        sock.sendall(big + b"GET /after HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        rest = b""
        while chunk := sock.recv(65536):
            rest += chunk
    assert answers(rest)[0]["path"] == "/after"


def test_a_chunked_request_body_arrives_whole(served: Served) -> None:
    data = (b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")  # fmt: skip
    assert answers(talk(served, data))[0]["body"] == "hello world"


def test_expect_100_continue_waits_for_the_go_ahead(served: Served) -> None:
    with socket.create_connection(served.addr, timeout=5) as sock:
        sock.sendall(b"POST /e HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
                     b"Content-Length: 4\r\n\r\n")  # fmt: skip
        assert sock.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(b"body")
        got = b""
        while not _complete(got):
            got += sock.recv(65536)
    assert answers(got)[0]["body"] == "body"


def test_http_1_0_closes_after_the_answer(served: Served) -> None:
    got = talk(served, b"GET /old HTTP/1.0\r\n\r\n", until_closed=True)
    assert b"connection: close" in got.lower()
    assert answers(got)[0]["version"] == "1.0"
    streamed = talk(served, b"GET /no-length HTTP/1.0\r\n\r\n", until_closed=True)
    assert b"transfer-encoding" not in streamed.lower()  # close-delimited
    assert json.loads(streamed.partition(b"\r\n\r\n")[2])["path"] == "/no-length"


def test_an_answer_without_length_is_chunked_on_http_1_1(served: Served) -> None:
    got = talk(served, b"GET /no-length HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
               until_closed=True)  # fmt: skip
    assert b"transfer-encoding: chunked" in got.lower()
    assert got.endswith(b"\r\n0\r\n\r\n")


@pytest.mark.parametrize("garbage", [b"NOT HTTP AT ALL\r\n\r\n", b"GET / HTTP/1.1\r\nbad\r\n\r\n"])
def test_a_malformed_request_gets_400_and_is_closed(served: Served, garbage: bytes) -> None:
    got = talk(served, garbage, until_closed=True)
    assert got.startswith(b"HTTP/1.1 400 ")


def test_a_client_gone_mid_stream_is_reported_to_the_app(served: Served) -> None:
    served.app.events.clear()
    with socket.create_connection(served.addr, timeout=5) as sock:
        sock.sendall(b"GET /stream HTTP/1.1\r\nHost: t\r\n\r\n")
        got = b""
        while b"data: x" not in got:  # (the head is written before the first event)
            chunk = sock.recv(65536)
            assert chunk
            got += chunk
    deadline = time.monotonic() + 5
    while len(served.app.events) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert served.app.events == ["on_lost", "http.disconnect"]


# ---- the protocol without sockets --------------------------------------------------------


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.writes: list[bytes] = []
        self.closed = False
        self.reading = True

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.out += data
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default


async def _recording_app(scope: Scope, receive: Receive, send: Send, seen: list[Any]) -> None:
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    seen.append((scope["method"], scope["path"], scope["query_string"], scope["headers"], body))
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})  # fmt: skip
    await send({"type": "http.response.body", "body": b"ok"})


def _feed(chunks: list[bytes]) -> tuple[list[Any], bytes]:
    async def run() -> tuple[list[Any], bytes]:
        seen: list[Any] = []

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            await _recording_app(scope, receive, send, seen)

        proto = protocol_for(Connections(), app, ("127.0.0.1", 80))()
        transport = FakeTransport()
        proto.connection_made(transport)
        for chunk in chunks:
            while not transport.reading:  # pipelined: the protocol reads on when answered
                await asyncio.sleep(0)
            proto.data_received(chunk)
            await asyncio.sleep(0)
        for _ in range(50):
            await asyncio.sleep(0)
        proto.connection_lost(None)
        proto.guard.close()
        return seen, bytes(transport.out)

    return asyncio.run(run())


STREAM = (
    post(b"/v1/chat/completions", b'{"model":"m","messages":[]}', b"Authorization: Bearer k\r\n")
    + b"POST /x?q=%20y HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    + b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    + b"GET /health HTTP/1.1\r\nHost: t\r\nX-Long: "
    + b"v" * 300
    + b"\r\n\r\n"
)
WHOLE = _feed([STREAM])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=len(STREAM) - 1), max_size=12))
def test_any_split_of_the_stream_parses_to_the_same_requests(cuts: list[int]) -> None:
    points = [0, *sorted(set(cuts)), len(STREAM)]
    chunks = [STREAM[a:b] for a, b in itertools.pairwise(points) if b > a]
    assert _feed(chunks) == WHOLE
    assert len(WHOLE[0]) == 3 and WHOLE[1].count(b"HTTP/1.1 200 OK") == 3


def test_a_paused_transport_holds_the_stream_until_resumed() -> None:
    async def run() -> list[str]:
        steps: list[str] = []

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            await receive()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            proto.pause_writing()  # the client reads nothing: the kernel buffer is full
            steps.append("paused")
            await send({"type": "http.response.body", "body": b"a", "more_body": True})
            steps.append("sent")
            await send({"type": "http.response.body", "body": b""})

        proto = protocol_for(Connections(), app, None)()
        transport = FakeTransport()
        proto.connection_made(transport)
        proto.data_received(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        for _ in range(20):
            await asyncio.sleep(0)
        steps.append("resume")
        proto.resume_writing()
        for _ in range(20):
            await asyncio.sleep(0)
        proto.connection_lost(None)
        proto.guard.close()
        return steps

    assert asyncio.run(run()) == ["paused", "resume", "sent"]


async def _one_get(
    app: Any, ticks: int, transport: FakeTransport | None = None
) -> FakeTransport:
    """`app` behind the native protocol answers one GET on a fake connection, given `ticks`
    loop passes before the client goes away."""
    proto = protocol_for(Connections(), app, None)()
    transport = transport or FakeTransport()
    proto.connection_made(transport)
    proto.data_received(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    for _ in range(ticks):
        await asyncio.sleep(0)
    proto.connection_lost(None)
    proto.guard.close()
    return transport


def test_an_app_error_before_the_answer_is_a_500() -> None:
    async def run() -> bytes:
        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            raise ValueError("boom")

        transport = await _one_get(app, ticks=20)
        assert transport.closed
        return bytes(transport.out)

    assert asyncio.run(run()).startswith(b"HTTP/1.1 500 ")


def test_a_failed_startup_stops_the_server_before_it_listens() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "lifespan"
        await receive()
        await send({"type": "lifespan.startup.failed", "message": "no database"})

    async def run() -> None:
        server = NativeServer(app, "127.0.0.1", 0, Connections())
        with pytest.raises(StartupFailed, match="no database"):
            await server.serve()
        assert not server.started and not server.servers

    asyncio.run(run())


def test_after_startup_runs_once_the_startup_is_done_and_before_listening() -> None:
    events: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "lifespan"
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                events.append("startup")
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def run() -> None:
        server: NativeServer

        def after() -> None:
            events.append(f"after (listening: {bool(server.servers)})")
            server.should_exit = True

        server = NativeServer(app, "127.0.0.1", 0, Connections(), after_startup=after)
        await server.serve()

    asyncio.run(run())
    assert events == ["startup", "after (listening: False)"]


def _streamed(app_steps: Any) -> tuple[list[bytes], list[list[bytes]]]:
    """Run a streaming app on a fake transport: the writes, and the writes made by the
    time each of the app's waits began."""
    seen_at_waits: list[list[bytes]] = []

    async def run() -> list[bytes]:
        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            await receive()
            await app_steps(send, wait)

        async def wait() -> None:
            for _ in range(3):
                await asyncio.sleep(0)
            seen_at_waits.append(list(transport.writes))

        transport = FakeTransport()
        return (await _one_get(app, ticks=30, transport=transport)).writes

    return asyncio.run(run()), seen_at_waits


def test_what_a_stream_sends_without_waiting_leaves_in_one_write() -> None:
    async def steps(send: Send, wait: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: a\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"data: b\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    writes, _ = _streamed(steps)
    assert len(writes) == 1
    assert writes[0].startswith(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    assert writes[0].endswith(b"9\r\ndata: a\n\n\r\n9\r\ndata: b\n\n\r\n0\r\n\r\n")


def test_a_stream_head_and_bytes_are_not_held_while_the_app_waits() -> None:
    async def steps(send: Send, wait: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await wait()  # an engine's prefill: the head is out before the first byte
        await send({"type": "http.response.body", "body": b"data: a\n\n", "more_body": True})
        await wait()  # between tokens: the event is out
        await send({"type": "http.response.body", "body": b""})

    writes, at_waits = _streamed(steps)
    assert at_waits[0] == [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"]
    assert at_waits[1] == writes[:2] and writes[1] == b"9\r\ndata: a\n\n\r\n"
    assert writes[2:] == [b"0\r\n\r\n"]
