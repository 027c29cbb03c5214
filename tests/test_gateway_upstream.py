"""The lean upstream HTTP client: keep-alive reuse, chunked bodies, dead connections."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from test_gateway_fakes import FakeEngine, Harness, harness  # noqa: F401

from inferplane.gateway.upstream import Endpoint, UpstreamBodyError, UpstreamClient, UpstreamError

CHAT = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})


def test_connections_are_kept_alive_and_reused(harness: Harness) -> None:  # noqa: F811
    engine = harness.engine("m")

    async def scenario() -> list[int]:
        client = UpstreamClient()
        ids = []
        for _ in range(3):
            conn = await client.post(
                engine.url, "/v1/chat/completions", CHAT, b"X-Request-ID: a\r\n"
            )
            assert conn.status == 200 and conn.content_type.startswith(b"application/json")
            assert orjson.loads(await conn.read_all())["usage"]["completion_tokens"] == 2
            conn.release()
            ids.append(id(conn))
        assert len(client.endpoint(engine.url).idle) == 1
        client.close()
        return ids

    ids = harness.run(scenario())
    assert len(set(ids)) == 1
    assert engine.headers[-1]["X-Request-ID"] == "a"


def test_chunked_stream_arrives_whole_and_in_order(harness: Harness) -> None:  # noqa: F811
    engine = harness.engine("m")
    engine.chunks = 50
    body = orjson.dumps({"model": "m", "messages": [], "stream": True})

    async def scenario() -> bytes:
        client = UpstreamClient()
        conn = await client.post(engine.url, "/v1/chat/completions", body, b"")
        parts = []
        while chunk := await conn.read_chunk():
            parts.append(chunk)
        conn.release()
        client.close()
        return b"".join(parts)

    got = harness.run(scenario())
    assert got == b"".join(engine.stream_bytes(body, "m", include_usage=False))


def test_stale_idle_connection_is_replaced_transparently(harness: Harness) -> None:  # noqa: F811
    engine = harness.engine("m")

    async def scenario() -> int:
        client = UpstreamClient()
        conn = await client.post(engine.url, "/v1/chat/completions", CHAT, b"")
        await conn.read_all()
        conn.release()
        stale = client.endpoint(engine.url).idle[0]
        assert stale.transport is not None
        stale.transport.abort()  # as if the engine closed the idle connection
        await asyncio.sleep(0.01)
        conn = await client.post(engine.url, "/v1/chat/completions", CHAT, b"")
        await conn.read_all()
        conn.release()
        client.close()
        return conn.status

    assert harness.run(scenario()) == 200


def test_refused_connection_and_mid_body_death_raise_distinct_errors(harness: Harness) -> None:  # noqa: F811
    engine = harness.engine("m")
    engine.die_after_chunks = 1
    body = orjson.dumps({"model": "m", "messages": [], "stream": True})

    async def scenario() -> None:
        client = UpstreamClient()
        with pytest.raises(UpstreamError):
            await client.post("http://127.0.0.1:1", "/v1/chat/completions", CHAT, b"")
        conn = await client.post(engine.url, "/v1/chat/completions", body, b"")
        with pytest.raises(UpstreamBodyError):
            while await conn.read_chunk():
                pass
        conn.close()
        client.close()

    harness.run(scenario())


def test_endpoint_rejects_non_http_urls() -> None:
    with pytest.raises(ValueError):
        Endpoint("ftp://x")
    assert Endpoint("https://engine.example").port == 443
    assert Endpoint("http://10.0.0.1:8001").host_header == b"10.0.0.1:8001"


def test_a_body_read_slower_than_it_arrives_pauses_the_engine_connection() -> None:
    """Above the high-water of unread body bytes the connection stops reading from the
    engine; reading the body resumes it, and every byte arrives once, in order."""
    events = [b"data: %06d\n\n" % i for i in range(40_000)]  # ~560 KB of chunked framing

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(len(CHAT))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")  # fmt: skip
        for _ in range(3):  # ~1.7 MB in all, past the 1 MiB high-water
            for event in events:
                writer.write(b"%x\r\n%b\r\n" % (len(event), event))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()  # until the client closes

    async def scenario() -> tuple[bool, bytes]:
        server = await asyncio.start_server(engine, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = UpstreamClient()
        conn = await client.post(f"http://127.0.0.1:{port}", "/v1/x", CHAT, b"")
        for _ in range(200):  # read nothing until the engine's side stalls
            await asyncio.sleep(0.01)
            if conn._paused:
                break
        paused = conn._paused
        body = []
        while chunk := await conn.read_chunk():
            body.append(chunk)
        conn.close()
        client.close()
        server.close()
        return paused, b"".join(body)

    paused, body = asyncio.run(scenario())
    assert paused
    assert body == b"".join(events) * 3
