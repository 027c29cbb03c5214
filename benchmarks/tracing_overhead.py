"""Tracing's cost on the gateway's hot path: the proxy with tracing off, on (every request
sampled, spans handed to an exporter that drops them) and on with sample_ratio 0.

Drives the gateway's ASGI app in-process against a canned upstream on 127.0.0.1 (keep-
alive HTTP/1.1, a fixed JSON body or SSE stream), so the figures are the gateway's own
work plus one local round trip. Rows are interleaved in rounds (off, on, unsampled, ...)
and the median round is reported with its ratio to "off" from the same run.

    python benchmarks/tracing_overhead.py [--requests 3000] [--rounds 5]

The "on" rows export through a SimpleSpanProcessor (synchronous); production uses the
BatchSpanProcessor, which moves the export off the request path.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from opentelemetry.sdk.trace import ReadableSpan  # noqa: E402
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult  # noqa: E402

from inferplane.gateway import GatewayConfig, ModelRoute, build_app  # noqa: E402
from inferplane.gateway.app import GatewayApp  # noqa: E402
from inferplane.gateway.tracing import TracingConfig  # noqa: E402

JSON_BODY = (b'{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"ok",'
             b'"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,'
             b'"total_tokens":4}}')  # fmt: skip
SSE_BODY = b"".join(
    b'data: {"choices":[{"index":0,"text":"t","finish_reason":null}]}\n\n' for _ in range(8)
) + b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":8}}\n\ndata: [DONE]\n\n'


class Drop(SpanExporter):
    """Counts spans and drops them: the cost of making spans, not of shipping them."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A keep-alive engine that answers every POST at once with a canned body."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            stream = False
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            body = await reader.readexactly(length)
            stream = b'"stream":true' in body
            if stream:
                chunk = b"%x\r\n%s\r\n0\r\n\r\n" % (len(SSE_BODY), SSE_BODY)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n" + chunk)  # fmt: skip
            else:
                head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                writer.write(head + b"Content-Length: %d\r\n\r\n%s" % (len(JSON_BODY), JSON_BODY))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


async def one_request(app: GatewayApp, body: bytes, headers: list[tuple[bytes, bytes]]) -> int:
    # A fresh header list per request, as a server builds one: the gateway may append to it
    # (the ratio-0 path adds a traceparent), and a shared list grew by one per request.
    scope: dict[str, Any] = {
        "type": "http", "method": "POST", "path": "/v1/completions", "headers": list(headers),
    }  # fmt: skip
    sent = False
    never = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never.wait()  # the client stays connected
        return {"type": "http.disconnect"}

    status = 0

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status


async def run_row(app: GatewayApp, n: int, stream: bool, parent: bool = True) -> float:
    body = (b'{"model":"m","prompt":"hello","max_tokens":8'
            + (b',"stream":true}' if stream else b"}"))  # fmt: skip
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if parent:  # a client that traces: a sampled traceparent
        headers.append((b"traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"))
    t0 = time.perf_counter()
    for _ in range(n):
        status = await one_request(app, body, headers)
        assert status == 200, status
    return (time.perf_counter() - t0) / n * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    server = await asyncio.start_server(upstream, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    route = (ModelRoute("m", endpoints=(url,)),)
    drop, drop_unsampled = Drop(), Drop()
    apps = {
        "off": build_app(GatewayConfig(models=route, access_log=False)),
        "on (sampled)": build_app(GatewayConfig(
            models=route, access_log=False, tracing=TracingConfig(exporter=drop))),
        "on, sample_ratio 0": build_app(GatewayConfig(
            models=route, access_log=False,
            tracing=TracingConfig(exporter=drop_unsampled, sample_ratio=0.0))),
    }  # fmt: skip
    # A client's sampled traceparent forces sampling (ParentBased): the ratio-0 row gets
    # requests without one, so the gateway's own ratio decides (and drops every trace).
    parents = {"off": True, "on (sampled)": True, "on, sample_ratio 0": False}
    for app in apps.values():
        await app.startup()
    results: dict[tuple[str, bool], list[float]] = {}
    for stream in (False, True):
        for name, app in apps.items():  # warm-up: connections, caches
            await run_row(app, 200, stream, parents[name])
        for _ in range(args.rounds):
            for name, app in apps.items():
                results.setdefault((name, stream), []).append(
                    await run_row(app, args.requests, stream, parents[name])
                )
    for app in apps.values():
        await app.shutdown()
    server.close()
    print(f"{'row':<22} {'kind':<8} {'us/request':>11} {'ratio vs off':>13}")
    for stream in (False, True):
        base = statistics.median(results[("off", stream)])
        for name in apps:
            us = statistics.median(results[(name, stream)])
            kind = "stream" if stream else "json"
            print(f"{name:<22} {kind:<8} {us:>11.1f} {us / base:>13.2f}")
    print(f"spans exported: {drop.spans} (sampled), {drop_unsampled.spans} (ratio 0)")


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main())
