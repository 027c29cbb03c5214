"""Issue 19.3 and 19.7: client connections are bounded in time, head size and number, drain
closes idle and slow connections at once, and every accepted socket has TCP_NODELAY."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from test_gateway_fakes import FakeEngine, Harness, http_client

from inferplane.gateway import GatewayConfig, ModelRoute
from inferplane.gateway.app import GatewayApp
from inferplane.gateway.config import ConnectionLimits

FAST = ConnectionLimits(
    header_timeout_s=0.3, body_timeout_s=0.3, keepalive_timeout_s=0.5, max_header_bytes=8192
)
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    h = Harness()
    yield h
    h.close()


@pytest.fixture(scope="module")
def engine(harness: Harness) -> FakeEngine:
    return harness.engine("m")


def gateway(
    harness: Harness, engine: FakeEngine, limits: ConnectionLimits
) -> tuple[GatewayApp, tuple[str, int]]:
    config = GatewayConfig(
        models=(ModelRoute("m", endpoints=(engine.url,)),), access_log=False, connections=limits
    )
    app, url = harness.gateway(config)
    host, port = url.removeprefix("http://").split(":")
    return app, (host, int(port))


@pytest.fixture(scope="module")
def fast(harness: Harness, engine: FakeEngine) -> tuple[GatewayApp, tuple[str, int]]:
    return gateway(harness, engine, FAST)


def connect(addr: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(addr, timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the gateway sends until it closes; and when it closed."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data, time.monotonic()


def request(body: bytes = BODY) -> bytes:
    return HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body


def test_an_idle_connection_is_closed_after_the_header_timeout(fast) -> None:  # type: ignore[no-untyped-def]
    _, addr = fast
    t0 = time.monotonic()
    with connect(addr) as sock:
        data, closed = read_until_closed(sock)
    assert data == b""  # never sent a byte: closed without an answer
    assert closed - t0 < 5


def test_slowloris_gets_408_within_the_header_timeout(fast) -> None:  # type: ignore[no-untyped-def]
    app, addr = fast
    before = app.connections.timed_out["header"]
    t0 = time.monotonic()
    with connect(addr) as sock:
        sock.sendall(HEAD)  # and never the blank line
        data, closed = read_until_closed(sock)
    assert data.startswith(b"HTTP/1.1 408 ")
    assert b'"code":408' in data and b"connection: close" in data
    assert closed - t0 < 5
    assert app.connections.timed_out["header"] == before + 1
    with http_client() as client:
        text = client.get(f"http://{addr[0]}:{addr[1]}/metrics").text
    assert 'inferplane_client_connections_closed_total{reason="header_timeout"}' in text
    assert "inferplane_client_connections_cap " in text


def test_a_slow_body_gets_408_within_the_body_timeout(fast) -> None:  # type: ignore[no-untyped-def]
    _, addr = fast
    t0 = time.monotonic()
    with connect(addr) as sock:
        sock.sendall(HEAD + b"Content-Length: 100\r\n\r\n" + BODY[:10])
        data, closed = read_until_closed(sock)
    assert data.startswith(b"HTTP/1.1 408 ")
    assert closed - t0 < 5


def test_keep_alive_connection_is_closed_when_idle(fast) -> None:  # type: ignore[no-untyped-def]
    _, addr = fast
    with connect(addr) as sock:
        sock.sendall(request())
        data, _ = read_until_closed(sock)  # answered, then closed after keepalive_timeout
    assert data.startswith(b"HTTP/1.1 200 ")


@pytest.mark.parametrize("complete", [True, False])
def test_oversized_request_head_gets_431(fast, complete: bool) -> None:  # type: ignore[no-untyped-def]
    app, addr = fast
    before = app.connections.too_large
    big = b"X-Big: " + b"a" * 20_000 + b"\r\n"
    with connect(addr) as sock:
        sock.sendall(HEAD + big + (b"Content-Length: 0\r\n\r\n" if complete else b""))
        data, _ = read_until_closed(sock)
    assert data.startswith(b"HTTP/1.1 431 ")
    assert app.connections.too_large == before + 1


def test_the_connection_cap_refuses_cleanly(harness: Harness, engine: FakeEngine) -> None:
    app, addr = gateway(harness, engine, ConnectionLimits(max_connections=3))
    held = [connect(addr) for _ in range(3)]
    try:
        deadline = time.monotonic() + 5
        while len(app.connections.live) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        with connect(addr) as extra:
            extra.sendall(request())
            data, _ = read_until_closed(extra)
        assert data.startswith(b"HTTP/1.1 503 ")
        assert b"connection limit" in data and b"retry-after: 1" in data
        assert app.connections.refused >= 1
        held.pop().close()
        deadline = time.monotonic() + 5
        while len(app.connections.live) > 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        with connect(addr) as again:
            again.sendall(request())
            assert again.recv(65536).startswith(b"HTTP/1.1 200 ")
    finally:
        for sock in held:
            sock.close()


def test_the_cap_stays_below_the_descriptor_limit() -> None:
    import resource

    from inferplane.gateway.connections import Connections

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    conns = Connections(ConnectionLimits(max_connections=10**9, fd_reserve=100))
    assert conns.cap <= (soft - 100) // 2


def test_drain_closes_idle_and_slow_connections_and_lets_streams_finish(
    harness: Harness,
) -> None:
    streaming = harness.engine("m")
    streaming.chunks = 10
    streaming.chunk_delay_s = 0.1
    app, addr = gateway(harness, streaming, ConnectionLimits())  # default (long) timeouts
    idle, slow = connect(addr), connect(addr)
    idle.sendall(request())
    assert idle.recv(65536).startswith(b"HTTP/1.1 200 ")  # now idle on keep-alive
    slow.sendall(HEAD + b"Content-Length: 100\r\n\r\n" + BODY[:10])
    result: list[bytes] = []

    def stream() -> None:
        body = b'{"model": "m", "stream": true, "messages": [{"role": "user", "content": "x"}]}'
        with (
            http_client() as client,
            client.stream("POST", f"http://{addr[0]}:{addr[1]}/v1/chat/completions",
                          content=body) as r,
        ):  # fmt: skip
            result.append(r.read())

    thread = threading.Thread(target=stream)
    thread.start()
    deadline = time.monotonic() + 5
    while streaming.in_flight == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    t0 = time.monotonic()
    harness.loop.call_soon_threadsafe(app.connections.drain)
    idle_data, idle_closed = read_until_closed(idle)
    slow_data, slow_closed = read_until_closed(slow)
    assert idle_data == b"" and idle_closed - t0 < 5
    assert slow_data.startswith(b"HTTP/1.1 503 ") and slow_closed - t0 < 5
    thread.join(30)
    assert result and result[0].count(b"tok") == 10  # the real stream ran to its end
    assert result[0].endswith(b"data: [DONE]\n\n")
    idle.close()
    slow.close()


def test_accepted_sockets_have_tcp_nodelay(fast) -> None:  # type: ignore[no-untyped-def]
    app, addr = fast
    with connect(addr) as sock:
        sock.sendall(HEAD + b"Content-Length: 100\r\n\r\n")
        deadline = time.monotonic() + 5
        while not app.connections.live and time.monotonic() < deadline:
            time.sleep(0.01)
        for proto in list(app.connections.live):
            server_sock = proto.transport.get_extra_info("socket")
            assert server_sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_oversized_head_on_a_reused_connection_gets_431(fast) -> None:  # type: ignore[no-untyped-def]
    _, addr = fast
    with connect(addr) as sock:
        sock.sendall(request())
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
        sock.sendall(HEAD + b"X-Big: " + b"a" * 20_000 + b"\r\n")
        data, _ = read_until_closed(sock)
    assert data.startswith(b"HTTP/1.1 431 ")


def test_a_trickled_body_is_cut_at_the_whole_body_deadline(  # issue 30 item 15
    harness: Harness, engine: FakeEngine
) -> None:
    limits = ConnectionLimits(header_timeout_s=0.5, body_timeout_s=0.5, body_total_timeout_s=1.0)
    _, addr = gateway(harness, engine, limits)
    t0 = time.monotonic()
    with connect(addr) as sock:
        sock.sendall(HEAD + b"Content-Length: 1000\r\n\r\n")
        sock.settimeout(0.2)
        data = b""
        while time.monotonic() - t0 < 8 and not data:
            try:
                sock.sendall(b" ")  # one byte per 0.2 s: every gap is under body_timeout_s
                data = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
    assert data.startswith(b"HTTP/1.1 408 ") and b"not received within 1 s" in data
    assert time.monotonic() - t0 < 5


def test_a_connection_flood_never_lingers_past_the_budget(  # issue 30 item 8
    harness: Harness, engine: FakeEngine
) -> None:
    from inferplane.gateway.connections import LINGER_S, MAX_LINGERING

    app, addr = gateway(harness, engine, ConnectionLimits(max_connections=2))
    held = [connect(addr) for _ in range(2)]
    extra: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 5
        while len(app.connections.live) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        extra = [connect(addr) for _ in range(MAX_LINGERING + 40)]
        deadline = time.monotonic() + 5
        while app.connections.refused < len(extra) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert app.connections.refused == len(extra)
        # Descriptors held for refused clients stay bounded whatever the flood's size.
        assert app.connections.lingering <= MAX_LINGERING
        time.sleep(LINGER_S + 0.5)
        assert app.connections.lingering == 0
    finally:
        for sock in held + extra:
            sock.close()


def test_descriptor_exhaustion_errors_are_logged_once_per_interval() -> None:
    import logging

    from inferplane.gateway.logfilter import RateLimitFilter

    now = [0.0]
    flt = RateLimitFilter(interval_s=10.0, clock=lambda: now[0])

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, None, None)

    passed = [flt.filter(record("socket.accept() out of system resource")) for _ in range(16_009)]
    assert passed.count(True) == 1  # once 16,009 tracebacks
    assert flt.filter(record("something else"))  # other errors are untouched
    now[0] = 11.0
    later = record("socket.accept() out of system resource")
    assert flt.filter(later) and "16008 more like it" in later.getMessage()


# The gateway as `inferplane up` serves it (asyncio's loop, the runtime's listening socket),
# in a child process whose descriptor limit is small: issue 30 item 8.
_FLOOD_CHILD = """
import asyncio, os, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[1])))
from inferplane.gateway import GatewayConfig, ModelRoute, logfilter
from inferplane.gateway.app import build_app
from inferplane.gateway.connections import ACCEPT_BATCH
from inferplane.gateway.server import gateway_server
from inferplane.runtime.runner import _bind

async def main():
    app = build_app(GatewayConfig(models=(ModelRoute("m", endpoints=("http://127.0.0.1:9",)),),
                                  access_log=False))
    sock = _bind("127.0.0.1", 0)
    logfilter.install()
    server = gateway_server(app, "127.0.0.1", 0, app.connections,
                            os.environ.get("INFERPLANE_TEST_GATEWAY_SERVER"), backlog=ACCEPT_BATCH)
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    print(sock.getsockname()[1], flush=True)
    await task

asyncio.run(main())
"""


# 400: the cap is (400 - fd_reserve 256) // 2 = 72 and the flood never reaches the limit;
# 128: below the reserve (cap 1), so accept() does hit EMFILE: asyncio's error, once.
@pytest.mark.parametrize("limit", [400, 128])
def test_a_flood_at_the_descriptor_limit_logs_one_line_and_leaks_nothing(limit: int) -> None:
    import contextlib
    import os
    import struct
    import subprocess
    import sys

    child = subprocess.Popen(
        [sys.executable, "-c", _FLOOD_CHILD, str(limit)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        port = int(child.stdout.readline())  # type: ignore[union-attr]
        base = f"http://127.0.0.1:{port}"
        with http_client() as client:
            assert client.get(base + "/health").status_code == 200
        idle = len(os.listdir(f"/proc/{child.pid}/fd"))
        flood = []
        for _ in range(3 * limit):  # far more than the limit, connecting all at once
            sock = socket.socket()
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError):  # connecting
                sock.connect(("127.0.0.1", port))
            flood.append(sock)
        time.sleep(0.5)
        for sock in flood:  # and all reset at once: some before the gateway answered them
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        deadline, status = time.monotonic() + 15, 0
        with http_client() as client:
            while time.monotonic() < deadline:
                open_fds = len(os.listdir(f"/proc/{child.pid}/fd"))
                if open_fds <= idle + 4:  # (a cap of 1 may still hold a reset client)
                    status = client.get(base + "/health").status_code
                    if status == 200:
                        break
                time.sleep(0.2)
        assert open_fds <= idle + 4, (open_fds, idle)  # every descriptor given back
        assert status == 200  # and still serving
    finally:
        child.terminate()
        _, err = child.communicate(timeout=30)
    assert "Traceback" not in err, err[-3000:]
    assert err.count("out of system resource") <= 1, err[-3000:]
