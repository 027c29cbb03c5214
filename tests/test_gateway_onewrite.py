"""One write per whole response (gateway/onewrite.py): JSON answers, pipelined or not,
leave in one socket write with uvicorn's bytes; a stream keeps uvicorn's own path."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from test_gateway_fakes import FakeEngine, Harness

from inferplane.gateway import GatewayConfig, ModelRoute
from inferplane.gateway.onewrite import OneWriteCycle

BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
STREAM = b'{"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]}'


def post(body: bytes, close: bool = False) -> bytes:
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json"
            b"\r\nContent-Length: %d\r\n%s\r\n" % (len(body), b"Connection: close\r\n" if close
                                                   else b"") + body)  # fmt: skip


@pytest.fixture(scope="module")
def addr() -> Iterator[tuple[str, int]]:
    h = Harness()
    engine: FakeEngine = h.engine("m")
    config = GatewayConfig(models=(ModelRoute("m", endpoints=(engine.url,)),), access_log=False)
    _, url = h.gateway(config)
    host, port = url.removeprefix("http://").split(":")
    yield host, int(port)
    h.close()


def read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def responses(data: bytes) -> list[tuple[bytes, bytes]]:
    """(head, body) of each Content-Length response in `data`, in order."""
    out = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))  # fmt: skip
        out.append((head, rest[:length]))
        data = rest[length:]
    return out


def test_json_answers_leave_in_one_write_each(
    addr: tuple[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    whole: list[int] = []
    original = OneWriteCycle._write_whole

    def spy(self: OneWriteCycle, start: Any, body: bytes) -> bool:
        done = original(self, start, body)
        whole.append(int(done))
        return done

    monkeypatch.setattr(OneWriteCycle, "_write_whole", spy)
    with socket.create_connection(addr, timeout=10) as sock:
        # three requests on one keep-alive connection, two of them pipelined
        sock.sendall(post(BODY))
        sock.sendall(post(BODY) + post(BODY, close=True))
        got = responses(read_all(sock))
    assert len(got) == 3 and whole == [1, 1, 1]
    for i, (head, body) in enumerate(got):
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"content-type: application/json" in head and b'"usage"' in body
        assert (b"connection: close" in head) == (i == 2)


def test_a_stream_keeps_uvicorns_path(
    addr: tuple[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[bytes] = []

    def spy(self: OneWriteCycle, start: Any, body: bytes) -> bool:
        calls.append(body)
        return False

    monkeypatch.setattr(OneWriteCycle, "_write_whole", spy)
    with socket.create_connection(addr, timeout=10) as sock:
        sock.sendall(post(STREAM, close=True))
        data = read_all(sock)
    assert calls == []  # never held: no Content-Length on a stream
    assert data.startswith(b"HTTP/1.1 200 OK\r\n") and b"transfer-encoding: chunked" in data
    assert data.rstrip().endswith(b"0") and b"data: [DONE]" in data


def test_errors_and_refusals_read_as_before(addr: tuple[str, int]) -> None:
    with socket.create_connection(addr, timeout=10) as sock:
        sock.sendall(post(b'{"model": "nope", "messages": []}', close=True))
        ((head, body),) = responses(read_all(sock))
    assert head.startswith(b"HTTP/1.1 404 Not Found\r\n") and b"model_not_found" in body
