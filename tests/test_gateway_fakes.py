"""Fakes for the gateway tests: a vLLM-like upstream and a thread that serves everything.

No tests here; other `test_gateway_*` modules import `Harness` and `FakeEngine`.
Responses are deterministic for a given request body, so a response fetched directly from
a fake engine and one fetched through the gateway can be compared byte for byte.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import httpx
import orjson
import pytest
import uvicorn
import uvloop
from aiohttp import web

from inferplane.gateway import GatewayConfig, build_app
from inferplane.gateway.app import GatewayApp
from inferplane.gateway.h1server import NativeServer
from inferplane.gateway.server import gateway_server

T = TypeVar("T")

# httpx does not set TCP_NODELAY and writes headers and body separately: Nagle plus the
# server's delayed ACK would add ~40 ms to every test request.
NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]


def http_client(timeout: float = 10.0) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(socket_options=NODELAY), timeout=timeout)


def async_http_client(timeout: float = 10.0) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(socket_options=NODELAY), timeout=timeout
    )


http = http_client()


def _bound_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


class FakeEngine:
    """Imitates a vLLM OpenAI server. Attributes steer its next responses."""

    def __init__(self, model: str = "served-model") -> None:
        self.model = model
        self.url = ""
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.fail_statuses: list[int] = []  # popped per request: answer with this 5xx/4xx
        self.delay_s = 0.0  # before answering
        self.hang = False  # never answer (until the caller goes away)
        self.chunks = 5
        self.chunk_delay_s = 0.0  # between streamed chunks
        # Answer this status to a chat body whose messages are not all objects (what the
        # simulator once did with 500 where vLLM answers 400).
        self.poison_status: int | None = None
        self.die_after_chunks: int | None = None
        self.stall_after_chunks: int | None = None  # stop sending, keep the connection
        self.last_with_end = False  # the last part and the chunked end in one write
        self.in_flight = 0
        self.cancelled = 0
        self.metrics_text: str | None = None
        self.health_status = 200
        self.health_hang = False  # /health never answers (a stopped process)
        # Token counts derived from each request (prompt from its size, completion from
        # max_tokens) instead of fixed ones, and a tally of every usage object sent.
        self.varied_usage = False
        self.reported_prompt_tokens = 0
        self.reported_completion_tokens = 0

    # -- response bodies ---------------------------------------------------------------

    def _id(self, raw: bytes) -> str:
        return "chatcmpl-" + hashlib.sha1(raw).hexdigest()[:16]

    def usage_for(self, raw: bytes, completion_tokens: int) -> dict[str, int]:
        """The usage object for a request, tallied as reported."""
        prompt = 7
        if self.varied_usage:
            prompt = 1 + len(raw) % 61
            completion_tokens = int(orjson.loads(raw).get("max_tokens") or completion_tokens)
        self.reported_prompt_tokens += prompt
        self.reported_completion_tokens += completion_tokens
        return {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
                "total_tokens": prompt + completion_tokens}  # fmt: skip

    def completion(self, raw: bytes, model: str) -> bytes:
        return orjson.dumps(
            {
                "id": self._id(raw),
                "object": "chat.completion",
                "created": 1700000000,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "hello there"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": self.usage_for(raw, 2),
            }
        )

    def chunk(self, raw: bytes, model: str, i: int, usage: bool = False) -> bytes:
        event: dict[str, Any] = {
            "id": self._id(raw),
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": model,
            "choices": [] if usage else [
                {"index": 0, "delta": {"content": f"tok{i} "}, "finish_reason": None}
            ],
        }  # fmt: skip
        if usage:
            event["usage"] = self.usage_for(raw, self.chunks)
        return b"data: " + orjson.dumps(event) + b"\n\n"

    def stream_bytes(self, raw: bytes, model: str, include_usage: bool) -> list[bytes]:
        parts = [self.chunk(raw, model, i) for i in range(self.chunks)]
        if include_usage:
            parts.append(self.chunk(raw, model, 0, usage=True))
        parts.append(b"data: [DONE]\n\n")
        return parts

    # -- handlers ----------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.in_flight += 1
        try:
            return await self._handle(request, raw)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1

    async def _handle(self, request: web.Request, raw: bytes) -> web.StreamResponse:
        data = orjson.loads(raw)
        self.requests.append(data)
        self.headers.append(dict(request.headers))
        messages = data.get("messages")
        if (
            self.poison_status
            and isinstance(messages, list)
            and not all(isinstance(m, dict) for m in messages)
        ):
            status = self.poison_status
            body = orjson.dumps({"error": {"message": "poisoned", "code": status}})
            return web.Response(status=status, body=body, content_type="application/json")
        if self.fail_statuses:
            status = self.fail_statuses.pop(0)
            body = orjson.dumps({"error": {"message": "engine failure", "code": status}})
            return web.Response(status=status, body=body, content_type="application/json")
        if self.hang:
            await asyncio.Event().wait()
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        model = data.get("model", "")
        if model != self.model:
            body = orjson.dumps(
                {"error": {"message": f"The model `{model}` does not exist.", "code": 404}}
            )
            return web.Response(status=404, body=body, content_type="application/json")
        if request.path == "/v1/embeddings":
            body = orjson.dumps(
                {
                    "object": "list",
                    "data": [{"object": "embedding", "index": 0, "embedding": [0.5, -0.25]}],
                    "model": model,
                    "usage": {"prompt_tokens": 3, "total_tokens": 3},
                }
            )
            return web.Response(body=body, content_type="application/json")
        if request.path == "/tokenize":
            body = orjson.dumps({"count": 3, "tokens": [1, 2, 3], "max_model_len": 4096})
            return web.Response(body=body, content_type="application/json")
        if data.get("stream"):
            include_usage = bool((data.get("stream_options") or {}).get("include_usage"))
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            parts = self.stream_bytes(raw, model, include_usage)
            last = parts.pop() if self.last_with_end else b""
            for i, part in enumerate(parts):
                if self.die_after_chunks is not None and i == self.die_after_chunks:
                    assert request.transport is not None
                    request.transport.abort()  # the engine process died
                    return resp
                if self.stall_after_chunks is not None and i == self.stall_after_chunks:
                    await asyncio.Event().wait()  # a wedged engine
                await resp.write(part)
                await asyncio.sleep(self.chunk_delay_s)
            await resp.write_eof(last)
            return resp
        return web.Response(body=self.completion(raw, model), content_type="application/json")

    async def metrics(self, request: web.Request) -> web.Response:
        if self.metrics_text is None:
            return web.Response(status=404)
        return web.Response(text=self.metrics_text)

    async def health(self, request: web.Request) -> web.Response:
        if self.health_hang:
            await asyncio.Event().wait()
        return web.Response(status=self.health_status)

    def app(self) -> web.Application:
        app = web.Application()
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/tokenize"):
            app.router.add_post(path, self.handle)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/health", self.health)
        return app


class Harness:
    """An event loop in a thread serving fake engines and gateways on 127.0.0.1."""

    def __init__(self) -> None:
        self.loop = uvloop.new_event_loop()  # what the gateway runs on in production
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._runners: list[web.AppRunner] = []
        self._servers: list[tuple[uvicorn.Server | NativeServer, asyncio.Task[None]]] = []

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def engine(self, model: str = "served-model") -> FakeEngine:
        engine = FakeEngine(model)

        async def start() -> None:
            runner = web.AppRunner(
                engine.app(), handler_cancellation=True, access_log=None, shutdown_timeout=0.1
            )
            await runner.setup()
            sock = _bound_socket()
            site = web.SockSite(runner, sock)
            await site.start()
            self._runners.append(runner)
            engine.url = f"http://127.0.0.1:{sock.getsockname()[1]}"

        self.run(start())
        return engine

    def gateway(self, config: GatewayConfig) -> tuple[GatewayApp, str]:
        app = build_app(config)
        return app, self.serve(app)

    def serve(self, app: GatewayApp) -> str:
        """Serve a built gateway app with uvicorn on a free port; returns its base URL."""

        async def start() -> str:
            sock = _bound_socket()
            # The gateway's configured server (native by default); the suite runs on
            # uvicorn's protocol with INFERPLANE_TEST_GATEWAY_SERVER=uvicorn.
            kind = os.environ.get("INFERPLANE_TEST_GATEWAY_SERVER") or app.config.server
            server = gateway_server(app, "127.0.0.1", 0, app.connections, kind, loop="none")
            task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
            while not server.started:
                await asyncio.sleep(0.005)
            self._servers.append((server, task))
            return f"http://127.0.0.1:{sock.getsockname()[1]}"

        return self.run(start())

    def close(self) -> None:
        async def stop() -> None:
            for server, task in self._servers:
                server.should_exit = True
                server.force_exit = True  # do not wait for hanging test requests
                await task
                await server.lifespan.shutdown()  # force_exit skips it
            for runner in self._runners:
                await runner.cleanup()

        self.run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    h = Harness()
    yield h
    h.close()
