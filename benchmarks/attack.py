"""Attack run: the scenarios of issues 19 and 30 against a gateway in front of simulated
engines (issue 30's are in `attack_round3.py`).

Everything runs in this process on 127.0.0.1 (simulated engines, the gateway, the attacking
clients), each scenario bounded in count and time, about a minute in all:

    python benchmarks/attack.py            # every scenario
    python benchmarks/attack.py --quick    # smaller counts
    python benchmarks/attack.py --only r3  # only the scenarios whose name starts with r3

Prints one table: scenario -> requests, outcomes, figures. The c=1 latency row compares
the gateway's connections with Nagle's algorithm left on (what `up` did before) against
TCP_NODELAY, measured in the same run. Exit code 1 when a scenario misses its bar.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import random
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import uvicorn
from aiohttp import web

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from inferplane.gateway import GatewayConfig, ModelRoute, Timeouts, build_app  # noqa: E402
from inferplane.gateway.app import GatewayApp  # noqa: E402
from inferplane.gateway.config import ConnectionLimits  # noqa: E402
from inferplane.gateway.connections import GuardedProtocol, protocol_for  # noqa: E402
from inferplane.gateway.h1server import NativeServer  # noqa: E402
from inferplane.gateway.server import gateway_server, uvicorn_config  # noqa: E402
from inferplane.sim.config import FaultConfig, SimEngineConfig  # noqa: E402
from inferplane.sim.host import EngineHandle, start_engines, stop_engines  # noqa: E402

HOST = "127.0.0.1"
GOOD = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]}
POISON = {"model": "m", "messages": [1, 2]}
Row = tuple[str, str, str, str, bool]  # scenario, requests, outcomes, figures, ok
ROWS: list[Row] = []


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


# ---- servers ------------------------------------------------------------------------------


class Gateway:
    def __init__(self, app: GatewayApp, url: str, server: uvicorn.Server | NativeServer,
                 task: asyncio.Task[None]):  # fmt: skip
        self.app, self.url, self.server, self.task = app, url, server, task
        self.addr = (HOST, int(url.rsplit(":", 1)[1]))

    async def stop(self) -> None:
        self.server.should_exit = self.server.force_exit = True
        await self.task
        await self.server.lifespan.shutdown()


async def gateway(
    config: GatewayConfig, tenancy: Any = None, protocol: type[GuardedProtocol] | None = None
) -> Gateway:
    app = build_app(config, tenancy)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, 0))
    # The gateway's configured server (gateway.server, native by default); an explicit
    # `protocol` is uvicorn's with that protocol class.
    server: uvicorn.Server | NativeServer = (
        gateway_server(app, HOST, 0, app.connections, loop="none") if protocol is None
        else uvicorn.Server(uvicorn_config(app, HOST, 0, loop="none", http=protocol))
    )  # fmt: skip
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.005)
    return Gateway(app, f"http://{HOST}:{sock.getsockname()[1]}", server, task)


def model(endpoints: list[str], **route: Any) -> GatewayConfig:
    return GatewayConfig(
        models=(ModelRoute("m", endpoints=tuple(endpoints), **route),),
        access_log=False, health_interval_s=0.2,
    )  # fmt: skip


async def sims(n: int, **faults: Any) -> list[EngineHandle]:
    config = SimEngineConfig(model="m", max_model_len=4096, eos_after_tokens=64)
    configs = [config] * n
    if faults:
        configs[0] = SimEngineConfig(model="m", max_model_len=4096, eos_after_tokens=64,
                                     faults=FaultConfig(**faults))  # fmt: skip
    return await start_engines(configs)


async def poison_engines(n: int) -> tuple[list[str], Callable[[], Awaitable[None]]]:
    """Engines that answer 500 to `"messages": [1, 2]` (the simulator before this fix)."""

    async def chat(request: web.Request) -> web.Response:
        data = orjson.loads(await request.read())
        if not all(isinstance(m, dict) for m in data.get("messages", [])):
            return web.json_response({"error": {"message": "boom", "code": 500}}, status=500)
        usage = {"prompt_tokens": 3, "completion_tokens": 2}
        return web.json_response({"choices": [{"message": {"content": "ok"}}], "usage": usage})

    async def health(request: web.Request) -> web.Response:
        return web.Response(status=200)

    runners, urls = [], []
    for _ in range(n):
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_get("/health", health)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, HOST, 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        runners.append(runner)
        urls.append(f"http://{HOST}:{port}")

    async def stop() -> None:
        for r in runners:
            await r.cleanup()

    return urls, stop


# ---- clients ------------------------------------------------------------------------------


async def post_many(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], n: int, concurrency: int,
    headers: dict[str, str] | None = None,
) -> collections.Counter[int]:
    codes: collections.Counter[int] = collections.Counter()
    todo = iter(range(n))

    async def worker() -> None:
        for _ in todo:
            try:
                async with session.post(url + "/v1/chat/completions", json=body,
                                        headers=headers) as r:  # fmt: skip
                    await r.read()
                    codes[r.status] += 1
            except aiohttp.ClientError:
                codes[0] += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return codes


def fmt(codes: collections.Counter[int]) -> str:
    return " ".join(f"{k}x{v}" for k, v in sorted(codes.items()))


async def read_until_closed(reader: asyncio.StreamReader, timeout_s: float) -> tuple[bytes, bool]:
    data = b""
    try:
        async with asyncio.timeout(timeout_s):
            while chunk := await reader.read(65536):
                data += chunk
        return data, True
    except TimeoutError:
        return data, False
    except ConnectionError:
        return data, True


# ---- scenarios ----------------------------------------------------------------------------


async def malformed_flood(replicas: int, n: int, engine: str) -> None:
    stop: Callable[[], Awaitable[None]]
    if engine == "sim":
        handles = await sims(replicas)
        urls, stop = [h.url for h in handles], lambda: stop_engines(handles)
    else:
        urls, stop = await poison_engines(replicas)
    gw = await gateway(model(urls))
    async with aiohttp.ClientSession() as s:
        attack, victim = await asyncio.gather(
            post_many(s, gw.url, POISON, n, 3), post_many(s, gw.url, GOOD, n, 3)
        )
    ejected = sum(b.ejected for b in gw.app.state.backends("m"))
    ok = victim[200] / n
    ROWS.append((
        f"malformed flood, {replicas} replica(s), engine {engine}",
        f"{n} bad + {n} good", f"bad: {fmt(attack)}; good: {fmt(victim)}",
        f"good ok {ok:.1%}, ejected {ejected}", ok >= 0.99,
    ))  # fmt: skip
    await gw.stop()
    await stop()


async def aborted_streams(n: int) -> None:
    from inferplane.store import Store
    from inferplane.tenancy.keys import create_key
    from inferplane.tenancy.ledger import usage_report
    from inferplane.tenancy.service import Tenancy

    tmp = tempfile.mkdtemp()
    store = Store(f"sqlite:///{tmp}/db.sqlite")
    tenancy = Tenancy(store, auth="auto", refresh_s=0.05, ledger_flush_s=0.05, announce=False)
    handles = await sims(1)
    gw = await gateway(model([handles[0].url]), tenancy)
    _, secret = await create_key(store, "capped", budget_tokens=2000, budget_period="day")
    await tenancy.refresh()
    headers = {"Authorization": f"Bearer {secret}"}
    body = {**GOOD, "max_tokens": 200, "ignore_eos": True, "stream": True}
    codes: collections.Counter[int] = collections.Counter()
    received = 0
    async with aiohttp.ClientSession() as s:
        for _ in range(n):
            async with s.post(gw.url + "/v1/chat/completions", json=body, headers=headers) as r:
                codes[r.status] += 1
                if r.status != 200:
                    break
                events = 0
                async for line in r.content:
                    if line.startswith(b"data: ") and b'"content":""' not in line:
                        events += 1
                        if events == 10:
                            break  # the client leaves after 10 tokens
                received += events
            # leaving the `async with` closes the connection mid-stream
    await asyncio.sleep(0.3)
    assert tenancy.ledger is not None
    await tenancy.ledger.flush()
    (row,) = await usage_report(store, by="key")
    billed = row["prompt_tokens"] + row["completion_tokens"]
    ROWS.append((
        "streams cut after 10 tokens vs 2,000-token budget", f"{sum(codes.values())}",
        fmt(codes),
        f"client read {received} tokens, ledger {row['completion_tokens']} completion (what"
        f" was relayed) + {row['prompt_tokens']} prompt = {billed}; refused at request "
        f"{codes[200] + 1}",
        # Refused once the next request's output reservation (max_tokens 200) no longer
        # fits the budget (issue 30 item 5): what was billed plus it reaches 2,000.
        429 in codes and row["completion_tokens"] >= received and billed + 200 >= 2000,
    ))  # fmt: skip
    await gw.stop()
    await stop_engines(handles)
    await store.close()


async def slow_connections(n: int, limits: ConnectionLimits) -> None:
    handles = await sims(1)
    gw = await gateway(GatewayConfig(models=(ModelRoute("m", endpoints=(handles[0].url,)),),
                                     access_log=False, connections=limits))  # fmt: skip
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
    kinds: dict[str, bytes] = {
        "idle (sends nothing)": b"",
        "slowloris (head never ends)": head,
        "slow body (10 of 100 bytes)": head + b"Content-Length: 100\r\n\r\n" + b"{" * 10,
    }
    bound = max(limits.header_timeout_s, limits.body_timeout_s) + 2
    for name, payload in kinds.items():
        conns = [await asyncio.open_connection(*gw.addr) for _ in range(n)]
        t0 = time.monotonic()
        for _, w in conns:
            if payload:
                w.write(payload)
        results = await asyncio.gather(*(read_until_closed(r, bound + 5) for r, _ in conns))
        took = time.monotonic() - t0
        closed = sum(c for _, c in results)
        answered = collections.Counter(d[9:12].decode() or "-" for d, _ in results)
        ROWS.append((
            name, f"{n} connections", f"closed {closed}/{n}; answers {dict(answered)}",
            f"all closed after {took:.1f} s (timeout {limits.header_timeout_s:g} s)",
            closed == n and took < bound,
        ))  # fmt: skip
        for _, w in conns:
            w.close()
    # Oversized request heads.
    before = rss_mib()
    big = head + b"X-Big: " + b"a" * (1 << 20) + b"\r\n\r\n"
    answers: collections.Counter[str] = collections.Counter()
    for _ in range(20):
        r, w = await asyncio.open_connection(*gw.addr)
        w.write(big)
        with contextlib.suppress(ConnectionError):
            await w.drain()
        data, _ = await read_until_closed(r, 10)
        answers[data[9:12].decode() or "-"] += 1
        w.close()
    ROWS.append((
        "1 MiB request head", "20 connections", f"answers {dict(answers)}",
        f"RSS {before:.0f} -> {rss_mib():.0f} MiB (limit {limits.max_header_bytes} B)",
        answers["431"] == 20,
    ))  # fmt: skip
    await gw.stop()
    await stop_engines(handles)


async def connection_cap(cap: int, extra: int) -> None:
    handles = await sims(1)
    gw = await gateway(GatewayConfig(
        models=(ModelRoute("m", endpoints=(handles[0].url,)),), access_log=False,
        connections=ConnectionLimits(max_connections=cap),
    ))  # fmt: skip
    held = [await asyncio.open_connection(*gw.addr) for _ in range(cap)]
    while len(gw.app.connections.live) < cap:
        await asyncio.sleep(0.01)
    refused = 0
    for _ in range(extra):
        r, w = await asyncio.open_connection(*gw.addr)
        data, _ = await read_until_closed(r, 5)
        refused += data.startswith(b"HTTP/1.1 503")
        w.close()
    for _, w in held[:10]:
        w.close()
    await asyncio.sleep(0.2)
    async with aiohttp.ClientSession() as s:
        after = await post_many(s, gw.url, GOOD, 5, 1)
    ROWS.append((
        f"connection cap {cap}", f"{cap} held + {extra} more", f"refused {refused}/{extra} (503)",
        f"after 10 freed: {fmt(after)}", refused == extra and after[200] == 5,
    ))  # fmt: skip
    for _, w in held[10:]:
        w.close()
    await gw.stop()
    await stop_engines(handles)


_FD_GATEWAY = """
import resource, sys
sys.path.insert(0, {repo!r})
resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from inferplane.gateway import GatewayConfig, ModelRoute, build_app
from inferplane.gateway.server import gateway_server
app = build_app(GatewayConfig(models=(ModelRoute("m", endpoints=({url!r},)),), access_log=False))
gateway_server(app, "127.0.0.1", {port}).run()
"""


async def fd_exhaustion(limit: int, conns: int) -> None:
    """A gateway process with a low descriptor limit, flooded with open connections: it
    refuses the excess with 503 before it runs out, and serves again afterwards."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    handles = await sims(1)
    probe = socket.socket()
    probe.bind((HOST, 0))
    port = probe.getsockname()[1]
    probe.close()
    code = _FD_GATEWAY.format(repo=str(REPO), limit=limit, url=handles[0].url, port=port)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    url = f"http://{HOST}:{port}"
    try:
        async with aiohttp.ClientSession() as s:
            for _ in range(200):
                with contextlib.suppress(aiohttp.ClientError):
                    async with s.get(url + "/health") as r:
                        if r.status == 200:
                            break
                await asyncio.sleep(0.05)
        held = [await asyncio.open_connection(HOST, port) for _ in range(conns)]
        refused = 0
        await asyncio.sleep(0.3)
        for reader, _ in held:
            with contextlib.suppress(TimeoutError):
                data = await asyncio.wait_for(reader.read(64), 0.05)
                refused += data.startswith(b"HTTP/1.1 503")
        for _, writer in held:
            writer.close()
        await asyncio.sleep(0.5)
        async with aiohttp.ClientSession() as s:
            after = await post_many(s, url, GOOD, 5, 1)
        alive = proc.returncode is None
        stderr = b""
    finally:
        proc.terminate()
        _, stderr = await proc.communicate()
        await stop_engines(handles)
    emfile = b"Too many open files" in stderr
    ROWS.append((
        f"fd exhaustion (gateway soft limit {limit})", f"{conns} open connections",
        f"refused {refused} with 503; after: {fmt(after)}",
        f"cap {(limit - 256) // 2}; alive {alive}; 'Too many open files' logged: {emfile}",
        alive and after[200] == 5 and refused >= conns - (limit - 256) // 2 and not emfile,
    ))  # fmt: skip


async def hung_replica(n: int) -> None:
    handles = await sims(2, hang_after_requests=2)  # the first replica hangs after 2 requests
    timeouts = Timeouts(first_token_s=1.0, idle_s=3.0, total_s=30)
    gw = await gateway(model([h.url for h in handles], timeouts=timeouts))
    body = {**GOOD, "max_tokens": 32, "stream": True}
    codes: collections.Counter[str] = collections.Counter()
    ended: list[float] = []

    async def one(s: aiohttp.ClientSession) -> None:
        t0 = time.monotonic()
        async with s.post(gw.url + "/v1/chat/completions", json=body) as r:
            data = await r.read()
        kind = str(r.status) if b'"error"' not in data else f"{r.status}+error event"
        codes[kind] += 1
        ended.append(time.monotonic() - t0)

    async with aiohttp.ClientSession() as s:
        t0 = time.monotonic()
        await asyncio.gather(*(one(s) for _ in range(n)))
        took = time.monotonic() - t0
    hung = gw.app.state.backends("m")[0]
    slowest = max(ended)
    ROWS.append((
        "hung replica (1 of 2 stops answering)", f"{n} streams", dict(codes).__repr__(),
        f"ejected {hung.ejected}; slowest request {slowest:.1f} s (first byte 1 s, idle 3 s);"
        f" all done in {took:.1f} s", hung.ejected and slowest < 3.0 + 1.0,
    ))  # fmt: skip
    import logging

    logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)  # the hung engine's exit
    await gw.stop()
    await stop_engines(handles)


async def drain_with_slow_client() -> None:
    handles = await sims(1)
    gw = await gateway(model([handles[0].url]))
    body = {**GOOD, "max_tokens": 150, "ignore_eos": True, "stream": True}
    slow_r, slow_w = await asyncio.open_connection(*gw.addr)
    slow_w.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 100\r\n\r\n{")
    async with aiohttp.ClientSession() as s:
        t0 = time.monotonic()
        async with s.post(gw.url + "/v1/chat/completions", json=body) as r:
            await r.content.readline()
            gw.app.connections.drain()  # what `up`'s shutdown calls first
            slow, _ = await read_until_closed(slow_r, 30)
            slow_done = time.monotonic() - t0
            data = await r.read()
            stream_done = time.monotonic() - t0
    ok = data.endswith(b"data: [DONE]\n\n") and slow.startswith(b"HTTP/1.1 503")
    ROWS.append((
        "drain with a slow-body client", "1 stream + 1 slow body",
        f"slow: {slow[9:12].decode() or '-'}; stream: {'complete' if ok else 'cut'}",
        f"slow client out after {slow_done:.2f} s, stream done after {stream_done:.2f} s",
        ok and slow_done <= stream_done,
    ))  # fmt: skip
    slow_w.close()
    await gw.stop()
    await stop_engines(handles)


async def admin_fuzz(n: int) -> None:
    from inferplane.store import Store
    from inferplane.tenancy.service import Tenancy

    tmp = tempfile.mkdtemp()
    store = Store(f"sqlite:///{tmp}/db.sqlite")
    tenancy = Tenancy(store, auth="off", refresh_s=1, admin_token="t", announce=False)
    gw = await gateway(model(["http://127.0.0.1:9"]), tenancy)
    rnd = random.Random(19)
    values: list[Any] = [None, True, 0, -1, 1.5, 10**30, "alpha", "", "NaN", [], ["m"], [1],
                         {}, {"m": 1}, {"m": "NaN"}, {"m": -1}, "1e999"]  # fmt: skip
    fields = ["name", "models", "rpm", "tpm", "max_concurrent", "budget_tokens",
              "budget_period", "priority", "expires_in_s", "team", "targets", "key_id"]
    codes: collections.Counter[int] = collections.Counter()
    headers = {"Authorization": "Bearer t"}
    async with aiohttp.ClientSession() as s:
        for i in range(n):
            body = {f: rnd.choice(values) for f in rnd.sample(fields, rnd.randint(0, 4))}
            if i % 2:
                req = s.post(gw.url + "/admin/keys", json=body, headers=headers)
            else:
                req = s.put(gw.url + "/admin/routes/r", json=body, headers=headers)
            async with req as r:
                codes[r.status] += 1
    ROWS.append((
        "admin API fuzz", f"{n}", fmt(codes), "no 5xx" if not any(c >= 500 for c in codes)
        else "5xx seen", not any(c >= 500 for c in codes),
    ))  # fmt: skip
    await gw.stop()
    await store.close()


class _Nagle(GuardedProtocol):
    """The gateway's protocol with Nagle's algorithm left on (what `up` had)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)


async def latency_c1(n: int) -> None:
    medians = {}
    for name in ("Nagle on (before)", "TCP_NODELAY"):
        app = build_app(model(["http://127.0.0.1:9"]))
        proto = type("N", (_Nagle,), {"guard": app.connections}) if name.startswith("Nagle") \
            else protocol_for(app.connections)  # fmt: skip
        gw = await _serve(app, proto)
        r, w = await asyncio.open_connection(*gw.addr)
        w.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP,
                                                        socket.TCP_NODELAY, 1)  # fmt: skip
        req = b"GET /v1/models HTTP/1.1\r\nHost: gw\r\n\r\n"
        took = []
        for _ in range(n):
            t0 = time.perf_counter()
            w.write(req)
            head = await r.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await r.readexactly(length)
            took.append(time.perf_counter() - t0)
        medians[name] = statistics.median(took) * 1000
        w.close()
        await gw.stop()
    before, after = medians["Nagle on (before)"], medians["TCP_NODELAY"]
    ROWS.append((
        "c=1 GET /v1/models, reused connection", f"{n} x 2",
        " / ".join(f"{k} {v:.2f} ms" for k, v in medians.items()),
        f"{before / after:.0f}x faster with TCP_NODELAY", after < 1.0,
    ))  # fmt: skip


async def _serve(app: GatewayApp, proto: type[GuardedProtocol]) -> Gateway:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, 0))
    cfg = uvicorn_config(app, HOST, 0, loop="none", http=proto)
    server = uvicorn.Server(cfg)
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.005)
    return Gateway(app, f"http://{HOST}:{sock.getsockname()[1]}", server, task)


# ---- main ---------------------------------------------------------------------------------


async def main(quick: bool, only: str = "") -> int:
    k = 1 if quick else 3
    limits = ConnectionLimits(header_timeout_s=2.0, body_timeout_s=2.0, keepalive_timeout_s=5.0)
    steps: list[tuple[str, Callable[[], Awaitable[None]]]] = [
        ("flood2-500", lambda: malformed_flood(2, 100 * k, "500-on-malformed")),
        ("flood1-500", lambda: malformed_flood(1, 100 * k, "500-on-malformed")),
        ("flood2-sim", lambda: malformed_flood(2, 100 * k, "sim")),
        ("aborted", lambda: aborted_streams(60)),
        ("slow", lambda: slow_connections(100 * k, limits)),
        ("cap", lambda: connection_cap(200, 20 * k)),
        ("fds", lambda: fd_exhaustion(512, 400)),
        ("hung", lambda: hung_replica(10 * k)),
        ("drain", drain_with_slow_client),
        ("admin", lambda: admin_fuzz(200 * k)),
        ("latency", lambda: latency_c1(50 * k)),
    ]
    from attack_round3 import scenarios  # issue 30 (benchmarks/ is on sys.path)

    steps += scenarios(gateway, ROWS)
    steps = [(n, st) for n, st in steps if n.startswith(only)]
    for name, step in steps:
        try:
            async with asyncio.timeout(90):
                await step()
        except Exception as exc:  # a broken scenario is a row, not a crash
            ROWS.append((name, "-", f"error: {type(exc).__name__}: {exc}", "-", False))
    header = ("scenario", "requests", "outcomes", "figures")
    cells = [header, *(r[:4] for r in ROWS)]
    widths = [max(len(str(c[i])) for c in cells) for i in range(4)]
    line = " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    print(line + " | bar")
    print("-" * (len(line) + 6))
    for row in ROWS:
        text = " | ".join(str(c).ljust(w) for c, w in zip(row[:4], widths, strict=True))
        print(text + " | " + ("ok" if row[4] else "MISSED"))
    return 0 if all(r[4] for r in ROWS) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller counts")
    parser.add_argument("--only", default="", help="run the scenarios whose name starts so")
    args = parser.parse_args()
    os.environ.setdefault("INFERPLANE_GATEWAY_GC_DEFAULT", "1")
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    sys.exit(asyncio.run(main(args.quick, args.only)))
