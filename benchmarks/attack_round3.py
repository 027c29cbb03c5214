"""Issue 30's attacks (security and faults, round 3), as rows of `benchmarks/attack.py`.

Each scenario runs in the attack run's process on 127.0.0.1 against fake engines (aiohttp)
or the simulator, bounded in count and time, and appends one row per item: scenario,
requests, outcomes, figures, whether it met its bar. The PostgreSQL row uses
$INFERPLANE_TEST_POSTGRES_URL when it is set (a scratch database: its tables are dropped),
else SQLite.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from inferplane.gateway import GatewayConfig, ModelRoute, Timeouts, build_app
from inferplane.gateway.config import ConnectionLimits

HOST = "127.0.0.1"
CHAT = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]}
Row = tuple[str, str, str, str, bool]
GatewayFactory = Callable[..., Awaitable[Any]]


class FakeEngines:
    """Engines answering chat (delay and tokens from the body), /health, /v1/responses."""

    def __init__(self) -> None:
        self.runners: list[web.AppRunner] = []
        self.hung: set[int] = set()  # ports whose engine (and /health) never answers
        self.served_tokens = 0

    async def start(self, n: int) -> list[str]:
        urls = []
        for _ in range(n):
            app = web.Application()
            app.router.add_post("/v1/chat/completions", self._chat)
            app.router.add_get("/health", self._health)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, HOST, 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.runners.append(runner)
            urls.append(f"http://{HOST}:{port}")
        return urls

    def _port(self, request: web.Request) -> int:
        return int(request.url.port or 0)

    async def _health(self, request: web.Request) -> web.Response:
        if self._port(request) in self.hung:
            await asyncio.Event().wait()
        return web.Response(status=200)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        data = orjson.loads(await request.read())
        if self._port(request) in self.hung:
            await asyncio.Event().wait()
        tokens = int(data.get("max_tokens") or 4) * int(data.get("n") or 1)
        await asyncio.sleep(float(data.get("delay_s", 0.0)))  # a long generation
        self.served_tokens += tokens + 5
        usage = {"prompt_tokens": 5, "completion_tokens": tokens, "total_tokens": tokens + 5}
        if not data.get("stream"):
            return web.json_response({"id": "chatcmpl-x", "choices": [
                {"message": {"content": "ok"}}], "usage": usage})  # fmt: skip
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(5):
            await resp.write(b'data: {"choices":[{"delta":{"content":"t"}}]}\n\n')
            await asyncio.sleep(0.05)
        await resp.write(b'data: {"choices":[],"usage":' + orjson.dumps(usage) + b"}\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def stop(self) -> None:
        for r in self.runners:
            await r.cleanup()


def _model(urls: list[str], **route: Any) -> GatewayConfig:
    return GatewayConfig(models=(ModelRoute("m", endpoints=tuple(urls), **route),),
                         access_log=False, health_interval_s=0.2)  # fmt: skip


async def _tenancy(url: str | None = None) -> Any:
    from inferplane.store import Store
    from inferplane.tenancy.service import Tenancy

    url = url or f"sqlite:///{tempfile.mkdtemp()}/db.sqlite"
    return Tenancy(Store(url), auth="auto", refresh_s=0.05, ledger_flush_s=0.05,
                   admin_token="admin-token")  # fmt: skip


async def _post(s: aiohttp.ClientSession, url: str, body: Any, headers: Any = None,
                path: str = "/v1/chat/completions") -> tuple[int, bytes]:  # fmt: skip
    async with s.post(url + path, json=body, headers=headers) as r:
        return r.status, await r.read()


def fmt(codes: collections.Counter[Any]) -> str:
    return " ".join(f"{k}x{v}" for k, v in sorted(codes.items(), key=str))


# ---- items 1, 2: poisoned and giant model names ------------------------------------------


async def poisoned_ledger(gateway: GatewayFactory, rows: list[Row]) -> None:
    pg = os.environ.get("INFERPLANE_TEST_POSTGRES_URL")
    if pg:
        from sqlalchemy import text

        from inferplane.store import Store

        scratch = Store(pg)
        async with scratch.engine.begin() as conn:
            await conn.execute(text("DROP SCHEMA public CASCADE"))
            await conn.execute(text("CREATE SCHEMA public"))
        await scratch.close()
    tenancy = await _tenancy(pg)
    engines = FakeEngines()
    gw = await gateway(_model(await engines.start(1)), tenancy)
    codes: collections.Counter[int] = collections.Counter()
    async with aiohttp.ClientSession() as s:
        for name in ("nul\u0000", "x" * 300, "line\nbreak"):
            codes[(await _post(s, gw.url, {**CHAT, "model": name}))[0]] += 1
        good = [(await _post(s, gw.url, CHAT))[0] for _ in range(20)]
    ledger = tenancy.ledger
    ledger.add((time.time(), "r-poison", None, "nul\u0000" + "y" * 400, "-", 1, 1, 200,
                False, 0.0, 0.0, 0.0))  # a poisoned row reaching the ledger anyway
    await asyncio.sleep(0.3)
    await ledger.flush()
    rows.append((
        f"poisoned model names, {'PostgreSQL' if pg else 'SQLite'} ledger",
        "3 poisoned + 20 good + 1 poisoned row", f"poisoned: {fmt(codes)}",
        f"ledger wrote {ledger.written}/21, flush failures {ledger.failures}, "
        f"buffered {ledger.pending}, dropped {ledger.rejected}",
        codes[400] == 3 and good.count(200) == 20 and ledger.written == 21
        and ledger.pending == 0,
    ))  # fmt: skip
    await gw.stop()
    await engines.stop()
    await tenancy.store.close()


async def giant_model_names(gateway: GatewayFactory, rows: list[Row]) -> None:
    tmp = Path(tempfile.mkdtemp())
    tenancy = await _tenancy(f"sqlite:///{tmp}/db.sqlite")
    engines = FakeEngines()
    gw = await gateway(_model(await engines.start(1)), tenancy)
    await asyncio.sleep(0.2)
    before = sum(p.stat().st_size for p in tmp.iterdir())
    codes: collections.Counter[int] = collections.Counter()
    async with aiohttp.ClientSession() as s:
        for _ in range(5):
            codes[(await _post(s, gw.url, {**CHAT, "model": "x" * (4 << 20)}))[0]] += 1
        typos = collections.Counter([(await _post(s, gw.url, {**CHAT, "model": f"typo{i}"}))[0]
                                     for i in range(20)])  # fmt: skip
    await asyncio.sleep(0.3)
    await tenancy.ledger.flush()
    from inferplane.tenancy.ledger import usage_report

    models = {r["model"] for r in await usage_report(tenancy.store, "model")}
    grown = sum(p.stat().st_size for p in tmp.iterdir()) - before
    rows.append((
        "4 MB model names and typos", "5 x 4 MB + 20 typos", f"{fmt(codes)}; typos {fmt(typos)}",
        f"DB grew {grown / 1024:.0f} KiB; usage models {sorted(models)}",
        grown < 1 << 20 and models == {"-"},
    ))  # fmt: skip
    await gw.stop()
    await engines.stop()
    await tenancy.store.close()


# ---- items 3, 4, 13: /v1/responses -----------------------------------------------------


async def response_takeover(gateway: GatewayFactory, rows: list[Row]) -> None:
    from inferplane.sim.config import SimEngineConfig
    from inferplane.sim.host import start_engines, stop_engines
    from inferplane.tenancy.keys import create_key

    os.environ["VLLM_ENABLE_RESPONSES_API_STORE"] = "1"
    handles = await start_engines([SimEngineConfig(model="m", max_model_len=4096)])
    tenancy = await _tenancy()
    gw = await gateway(_model([handles[0].url]), tenancy)
    keys = {}
    for name in ("alice", "bob"):
        _, keys[name] = await create_key(tenancy.store, name)
    await tenancy.refresh()
    auth = {k: {"Authorization": f"Bearer {v}"} for k, v in keys.items()}
    async with aiohttp.ClientSession() as s:
        _, made = await _post(s, gw.url, {"model": "m", "input": "plan", "instructions": "A's",
                                          "request_id": "x", "max_output_tokens": 4},
                              auth["alice"], "/v1/responses")  # fmt: skip
        rid = orjson.loads(made)["id"]
        _, stolen = await _post(s, gw.url, {"model": "m", "input": "mine", "request_id": rid,
                                            "max_output_tokens": 4}, auth["bob"],
                                "/v1/responses")  # fmt: skip
        async with s.get(gw.url + f"/v1/responses/{rid}", headers=auth["bob"]) as r:
            bob_reads = r.status
        async with s.get(gw.url + f"/v1/responses/{rid}", headers=auth["alice"]) as r:
            alice_reads = r.status
        spellings = collections.Counter(
            [(await _post(s, gw.url, {"model": "m", "input": "x", "background": v},
                          auth["alice"], "/v1/responses"))[0] for v in ("true", 1, "yes")])
    same = orjson.loads(stolen).get("id") == rid
    rows.append((
        "response takeover via request_id; background spellings", "2 + 2 GETs + 3",
        f"bob's id == alice's: {same}; bob GET {bob_reads}, alice GET {alice_reads}; "
        f"background: {fmt(spellings)}", "ids namespaced per key, never re-owned",
        not same and bob_reads == 404 and alice_reads == 200 and spellings[400] == 3,
    ))  # fmt: skip
    await gw.stop()
    await stop_engines(handles)
    await tenancy.store.close()


def response_id_flood(rows: list[Row]) -> None:
    from inferplane.gateway.routes import ResponseOwners

    owners = ResponseOwners()
    owners.learn(b'{"id":"resp_alice"}', "m", "u", "alice")
    for i in range(10_001):
        owners.learn(b'{"id":"resp_b%d"}' % i, "m", "u", "bob")
    kept = owners.get("resp_alice") is not None
    rows.append(("response-id flood by one key", "10,001 ids of key B",
                 f"key A's id kept: {kept}", f"{len(owners)} remembered (B: at most "
                 f"{owners.per_key})", kept))  # fmt: skip


# ---- item 5: budgets and TPM --------------------------------------------------------------


async def budget_overrun(gateway: GatewayFactory, rows: list[Row]) -> None:
    from inferplane.tenancy.keys import create_key

    tenancy = await _tenancy()
    engines = FakeEngines()
    gw = await gateway(_model(await engines.start(1)), tenancy)
    _, budget = await create_key(tenancy.store, "budget", budget_tokens=2000,
                                 budget_period="day")  # fmt: skip
    _, tpm = await create_key(tenancy.store, "tpm", tpm=2000)
    await tenancy.refresh()
    body = {**CHAT, "max_tokens": 300, "delay_s": 0.5}
    async with aiohttp.ClientSession() as s:
        got = await asyncio.gather(*(_post(s, gw.url, body, {"Authorization": f"Bearer {budget}"})
                                     for _ in range(20)))  # fmt: skip
        served = engines.served_tokens
        big, _ = await _post(s, gw.url, {**CHAT, "n": 8, "max_tokens": 300},
                             {"Authorization": f"Bearer {tpm}"})  # fmt: skip
    codes = collections.Counter(c for c, _ in got)
    rows.append((
        "budget 2,000 tokens, 20 concurrent max_tokens=300; n=8 vs 2,000 TPM", "20 + 1",
        f"{fmt(codes)}; n=8: {big}", f"served {served} tokens ({served / 2000:.2f}x budget)",
        served <= 2000 and big == 429,
    ))  # fmt: skip
    await gw.stop()
    await engines.stop()
    await tenancy.store.close()


# ---- items 6, 10: deadlines and hung replicas -------------------------------------------


async def own_deadline(gateway: GatewayFactory, rows: list[Row]) -> None:
    engines = FakeEngines()
    urls = await engines.start(2)
    gw = await gateway(_model(urls, timeouts=Timeouts(first_token_s=30, idle_s=30, total_s=1.0)))
    async with aiohttp.ClientSession() as s:
        long = [_post(s, gw.url, {**CHAT, "delay_s": 3.0}) for _ in range(6)]
        others = [_post(s, gw.url, {**CHAT, "stream": True}) for _ in range(40)]
        out = await asyncio.gather(*long, *others)
    await asyncio.sleep(0.5)
    long_codes = collections.Counter(c for c, _ in out[:6])
    cut = sum(1 for c, b in out[6:] if c != 200 or b'"error"' in b)
    ejected = sum(b.ejected for b in gw.app.state.backends("m"))
    rows.append((
        "6 requests past total_s=1 s + 40 other streams", "46",
        f"long: {fmt(long_codes)}; others cut {cut}/40", f"ejected {ejected}",
        long_codes[504] == 6 and cut == 0 and ejected == 0,
    ))  # fmt: skip
    await gw.stop()
    await engines.stop()


async def hung_endpoint_defaults(gateway: GatewayFactory, rows: list[Row]) -> None:
    engines = FakeEngines()
    urls = await engines.start(2)
    gw = await gateway(GatewayConfig(models=(ModelRoute("m", endpoints=tuple(urls)),),
                                     access_log=False))  # default timeouts and health interval
    engines.hung.add(int(urls[0].rsplit(":", 1)[1]))
    slow = 0
    codes: collections.Counter[int] = collections.Counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        for _ in range(12):
            t0 = time.monotonic()
            with contextlib.suppress(TimeoutError):
                codes[(await _post(s, gw.url, CHAT))[0]] += 1
            slow += time.monotonic() - t0 >= 10
    ejected = gw.app.state.backends("m")[0].ejected
    rows.append((
        "hung endpoint replica, default timeouts", "12 sequential", fmt(codes),
        f"{slow} took >= 10 s; ejected {ejected} (its /health stopped answering)",
        ejected and slow == 0,
    ))  # fmt: skip
    await gw.stop()
    await engines.stop()


# ---- items 7, 9, 17: the console and engine addresses ----------------------------------


async def console_attacks(rows: list[Row]) -> None:
    import httpx

    from inferplane.console import attach
    from inferplane.tenancy.service import Tenancy

    open_app = build_app(GatewayConfig(models=(ModelRoute("m"),)))
    attach(open_app, None, "INFERPLANE_ATTACK_NO_TOKEN")
    evil = "rebind.attacker.example"
    transport = httpx.ASGITransport(app=open_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        rebound = (await c.post("/ui/api/instances/chat-0/restart", headers={
            "Host": evil, "Origin": f"http://{evil}", "x-inferplane-console": "1"})).status_code
    locked = build_app(GatewayConfig(models=(ModelRoute("m"),)))
    locked.tenancy = Tenancy(None, auth="on", admin_token="s3cret")
    console = attach(locked, None, "INFERPLANE_ADMIN_TOKEN")
    transport = httpx.ASGITransport(app=locked)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        signed = await c.post("/ui/login", data={"token": "s3cret"})
        value = signed.headers["set-cookie"].partition("=")[2].partition(";")[0]
        await c.post("/ui/logout")
        c.cookies.set("inferplane_console", value)
        replay = (await c.get("/ui/api/fleet")).status_code
        guesses = collections.Counter([(await c.post("/ui/login", data={"token": f"g{i}"}))
                                       .status_code for i in range(100)])  # fmt: skip
    await console.stop()
    rows.append((
        "console: DNS rebinding, cookie after sign-out, 100 token guesses", "1 + 1 + 100",
        f"rebound restart {rebound}; replayed cookie {replay}; guesses {fmt(guesses)}",
        "5 guesses a minute per client", rebound == 403 and replay == 401 and guesses[401] == 5,
    ))  # fmt: skip


async def engine_addresses(gateway: GatewayFactory, rows: list[Row]) -> None:
    import socket

    engines = FakeEngines()
    urls = await engines.start(1)
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        dead = f"http://{HOST}:{probe.getsockname()[1]}"
    gw = await gateway(_model(urls))
    broken = await gateway(_model([dead]))
    async with aiohttp.ClientSession() as s:
        async with s.post(gw.url + "/v1/chat/completions", json=CHAT) as r:
            header = r.headers.get("x-inferplane-replica")
        status, body = await _post(s, broken.url, CHAT)
        scraped = ""
        for url in (gw.url, broken.url):
            async with s.get(url + "/metrics") as r:
                scraped += await r.text()
    leaks = HOST in body.decode()
    in_metrics = HOST in scraped
    rows.append((
        "engine addresses in headers, 502s and /metrics", "2 + 2 scrapes",
        f"x-inferplane-replica: {header}; 502 names an address: {leaks}; "
        f"/metrics names one: {in_metrics}", f"502 says: {orjson.loads(body)['error']['message']}",
        header is None and status == 502 and not leaks and not in_metrics,
    ))  # fmt: skip
    await gw.stop()
    await broken.stop()
    await engines.stop()


# ---- items 8, 15: descriptors and trickled bodies ----------------------------------------


_FLOOD_CHILD = """
import asyncio, resource, socket, sys
limit, runtime_socket = int(sys.argv[1]), sys.argv[2] == "1"
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
from inferplane.gateway import GatewayConfig, ModelRoute, logfilter
from inferplane.gateway.app import build_app
from inferplane.gateway.connections import ACCEPT_BATCH
from inferplane.gateway.server import gateway_server
from inferplane.runtime.runner import _bind

async def main():
    app = build_app(GatewayConfig(models=(ModelRoute("m", endpoints=("http://127.0.0.1:9",)),),
                                  access_log=False))
    if runtime_socket:  # what `inferplane up` serves now
        sock, extra = _bind("127.0.0.1", 0), {"backlog": ACCEPT_BATCH}
    else:  # before: a plain socket, asyncio accepting 4,096 per tick
        sock, extra = socket.socket(), {}
        sock.bind(("127.0.0.1", 0))
        sock.listen(4096)
        sock.setblocking(False)
    logfilter.install()
    server = gateway_server(app, "127.0.0.1", 0, app.connections, **extra)
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    print(sock.getsockname()[1], flush=True)
    await task

asyncio.run(main())
"""


def _fd_flood(limit: int, n: int, runtime_socket: bool) -> dict[str, Any]:
    """The gateway as `up` serves it (asyncio's loop) in a child limited to `limit`
    descriptors; `n` connections at once, held 1 s, then all reset. Its peak descriptors
    (read from /proc every 2 ms), its stderr, and whether it answers afterwards."""
    import socket
    import struct
    import subprocess
    import threading

    import httpx

    child = subprocess.Popen(
        [sys.executable, "-c", _FLOOD_CHILD, str(limit), "1" if runtime_socket else "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    port = int(child.stdout.readline())  # type: ignore[union-attr]
    peak, done = [0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            with contextlib.suppress(OSError):
                peak[0] = max(peak[0], len(os.listdir(f"/proc/{child.pid}/fd")))
            time.sleep(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    flood = []
    for _ in range(n):
        sock = socket.socket()
        sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            sock.connect((HOST, port))
        flood.append(sock)
    time.sleep(1.0)
    for sock in flood:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    time.sleep(3.0)  # LINGER_S and asyncio's 1 s accept retry
    try:
        health = httpx.get(f"http://{HOST}:{port}/health", timeout=5).status_code
    except httpx.HTTPError:
        health = 0
    done.set()
    watcher.join()
    child.terminate()
    try:
        _, err = child.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        child.kill()
        _, err = child.communicate()
        health = health or -1
    return {"peak": peak[0], "health": health, "tracebacks": err.count("Traceback"),
            "resource_lines": err.count("out of system resource"), "log_bytes": len(err)}


async def connection_flood(gateway: GatewayFactory, rows: list[Row]) -> None:
    from inferplane.gateway.connections import MAX_LINGERING

    engines = FakeEngines()
    gw = await gateway(GatewayConfig(models=(ModelRoute("m", endpoints=tuple(
        await engines.start(1))),), access_log=False,
        connections=ConnectionLimits(max_connections=20)))  # fmt: skip
    held = [await asyncio.open_connection(*gw.addr) for _ in range(20)]
    peak = 0
    flood = []
    for _ in range(500):
        flood.append(await asyncio.open_connection(*gw.addr))
        peak = max(peak, gw.app.connections.lingering)
    for _, w in held + flood:
        w.close()
    rows.append((
        "connection flood over the cap (20)", "20 held + 500", f"refused "
        f"{gw.app.connections.refused}; lingering at most {peak}",
        f"descriptors for refused clients <= {MAX_LINGERING}", peak <= MAX_LINGERING,
    ))  # fmt: skip
    await gw.stop()
    await engines.stop()
    # The issue's attack on `up`'s gateway: 1,100 connections against 1,024 descriptors.
    before = await asyncio.to_thread(_fd_flood, 1024, 1100, False)
    after = await asyncio.to_thread(_fd_flood, 1024, 1100, True)
    rows.append((
        "1,100 connections at a 1,024-descriptor limit, all reset (up's asyncio loop)",
        "1,100", f"peak {after['peak']}/1024 fds; /health after: {after['health']}",
        f"{after['resource_lines']} accept() error line(s), {after['tracebacks']} tracebacks, "
        f"{after['log_bytes']} B logged; plain socket in the same run: peak "
        f"{before['peak']}/1024, {before['tracebacks']} tracebacks, {before['log_bytes']} B",
        after["peak"] < 1024 and after["health"] == 200 and after["tracebacks"] == 0
        and after["resource_lines"] <= 1,
    ))  # fmt: skip


def up_log_rotation(rows: list[Row]) -> None:
    """A detached `up`'s output flooding up.log while it runs (10 kB files here, 16 MiB by
    default): the writer rotates it to up.log.1..3."""
    from inferplane.runtime import control
    from inferplane.runtime.state import StateDir

    with tempfile.TemporaryDirectory() as tmp:
        state = StateDir(Path(tmp) / "state")
        keep, control.UP_LOG_ROTATE_BYTES = control.UP_LOG_ROTATE_BYTES, 10_000
        try:
            pid = control.spawn_detached([sys.executable, "-c", (
                "import time\nfor i in range(16009): print(f'accept() error {i}', flush=True)"
                "\nprint('done', flush=True)\ntime.sleep(30)")], state)  # fmt: skip
        finally:
            control.UP_LOG_ROTATE_BYTES = keep
        deadline = time.monotonic() + 30
        while "done" not in state.up_log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        files = sorted(state.path.glob("up.log*"))
        sizes = [f.stat().st_size for f in files]
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    rows.append((
        "a running detached up writes 16,009 lines (rotation at 10 kB)", "16,009 lines",
        f"{len(files)} files, largest {max(sizes)} B", "up.log + 3 rotated, each <= 10 kB",
        len(files) == 4 and max(sizes) <= 10_000,
    ))  # fmt: skip


async def trickled_body(gateway: GatewayFactory, rows: list[Row]) -> None:
    engines = FakeEngines()
    limits = ConnectionLimits(body_timeout_s=2.0, body_total_timeout_s=3.0)
    gw = await gateway(GatewayConfig(models=(ModelRoute("m", endpoints=tuple(
        await engines.start(1))),), access_log=False, connections=limits))  # fmt: skip
    reader, writer = await asyncio.open_connection(*gw.addr)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 100\r\n\r\n")
    t0 = time.monotonic()
    data = b""
    while time.monotonic() - t0 < 15 and not data:
        writer.write(b" ")  # one byte every 0.5 s: every gap is under body_timeout_s
        with contextlib.suppress(TimeoutError, ConnectionError):
            data = await asyncio.wait_for(reader.read(4096), 0.5)
    took = time.monotonic() - t0
    writer.close()
    rows.append((
        "body trickled a byte per 0.5 s", "1 connection", data.split(b"\r\n", 1)[0].decode(),
        f"closed after {took:.1f} s (whole body 3 s, gap 2 s)",
        data.startswith(b"HTTP/1.1 408") and took < 6,
    ))  # fmt: skip
    await gw.stop()
    await engines.stop()


# ---- items 12, 14, 16, 18 -------------------------------------------------------------


async def clock_step(rows: list[Row]) -> None:
    from inferplane.tenancy.limits import Limits, MemoryLimiter

    limiter, limits, t0 = MemoryLimiter(), Limits(rpm=10), 1_800_000_000.0
    for i in range(10):
        await limiter.acquire("k", str(i), limits, 0, t0)
    back = t0 - 3600.0
    locked = 0.0
    while not (await limiter.acquire("k", "x", limits, 0, back + locked)).allowed:
        locked += 1.0
    rows.append(("wall clock steps back 1 h (rpm 10, used up)", "1 key",
                 f"locked out {locked:.0f} s", "at most one window (60 s)", locked <= 60))


async def stopped_engine(rows: list[Row]) -> None:
    from inferplane.runtime.process import EngineProcess, RotatingLog

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import time; time.sleep(60)", start_new_session=True,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)  # fmt: skip
    engine = EngineProcess(proc, RotatingLog(Path(tempfile.mkdtemp()) / "e.log"))
    os.killpg(proc.pid, signal.SIGSTOP)
    await asyncio.sleep(0.2)
    t0 = time.monotonic()
    code = await engine.stop(timeout_s=15.0)
    took = time.monotonic() - t0
    rows.append(("SIGSTOPped engine stopped (15 s SIGTERM grace)", "1 process",
                 f"exit {code}", f"killed in {took:.2f} s", took < 2))  # fmt: skip


async def full_disk_restart(rows: list[Row]) -> None:
    from inferplane.runtime.process import RotatingLog, spawn

    log = RotatingLog(Path("/dev/full"))  # the state disk is full: every write is ENOSPC
    t0 = time.monotonic()
    try:
        proc = await spawn([sys.executable, "-c", "print('engine up')"], {}, log)
        code: object = await proc.wait()
    except OSError as exc:
        code = f"spawn failed: {exc.strerror}"
    rows.append(("engine (re)started while the state disk is full", "1 start", f"exit {code}",
                 f"started in {time.monotonic() - t0:.2f} s; {log.dropped} log lines dropped",
                 code == 0))  # fmt: skip


async def admin_validation(gateway: GatewayFactory, rows: list[Row]) -> None:
    tenancy = await _tenancy()
    engines = FakeEngines()
    urls = await engines.start(1)
    config = GatewayConfig(models=(ModelRoute("m", endpoints=tuple(urls)),
                                   ModelRoute("e", task="embed", endpoints=tuple(urls))),
                           access_log=False)  # fmt: skip
    gw = await gateway(config, tenancy)
    auth = {"Authorization": "Bearer admin-token"}
    codes: collections.Counter[int] = collections.Counter()
    async with aiohttp.ClientSession() as s:
        for targets in ({"ghost": 1}, {}, {"m": 1, "e": 1}):
            async with s.put(gw.url + "/admin/routes/r", json={"targets": targets},
                             headers=auth) as r:  # fmt: skip
                codes[r.status] += 1
        async with s.post(gw.url + "/admin/keys", json={"name": "k", "models": ["ghost"]},
                          headers=auth) as r:  # fmt: skip
            codes[r.status] += 1
    rows.append(("admin API: ghost/empty/mixed route, key for a ghost model", "4", fmt(codes),
                 "refused as the fleet file refuses them", codes[400] == 4))  # fmt: skip
    await gw.stop()
    await engines.stop()
    await tenancy.store.close()


async def state_files(rows: list[Row]) -> None:
    code = (
        "import asyncio, os, stat, sys; from pathlib import Path; os.umask(0o022)\n"
        "from inferplane.runtime.state import StateDir; from inferplane.store import Store\n"
        "d = StateDir(Path(sys.argv[1])); d.claim()\n"
        "(d.path / 'plan.json').write_text('{}')\n"
        "async def main():\n"
        "    s = await Store.open(f'sqlite:///{d.path}/inferplane.db')\n"
        "    await s.close()\n"
        "asyncio.run(main())\n"
        "print(sorted({oct(stat.S_IMODE(p.stat().st_mode)) for p in d.path.rglob('*')"
        " if p.is_file()}))\n"
    )
    state = Path(tempfile.mkdtemp()) / "state"
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, str(state),
                                                stdout=asyncio.subprocess.PIPE)  # fmt: skip
    out, _ = await proc.communicate()
    modes = out.decode().strip()
    rows.append(("state files under umask 022", "DB, WAL, plan, pid, state", modes,
                 "every file 0600", modes == "['0o600']"))  # fmt: skip


def scenarios(gateway: GatewayFactory, rows: list[Row]) -> list[tuple[str, Any]]:
    """(name, zero-argument coroutine factory) for attack.py's main loop."""

    async def flood_ids() -> None:
        response_id_flood(rows)

    async def up_log_async() -> None:
        await asyncio.to_thread(up_log_rotation, rows)

    return [
        ("r3-ledger", lambda: poisoned_ledger(gateway, rows)),
        ("r3-names", lambda: giant_model_names(gateway, rows)),
        ("r3-responses", lambda: response_takeover(gateway, rows)),
        ("r3-response-ids", flood_ids),
        ("r3-budget", lambda: budget_overrun(gateway, rows)),
        ("r3-deadline", lambda: own_deadline(gateway, rows)),
        ("r3-console", lambda: console_attacks(rows)),
        ("r3-flood", lambda: connection_flood(gateway, rows)),
        ("r3-up-log", up_log_async),
        ("r3-hung", lambda: hung_endpoint_defaults(gateway, rows)),
        ("r3-clock", lambda: clock_step(rows)),
        ("r3-stopped", lambda: stopped_engine(rows)),
        ("r3-disk-full", lambda: full_disk_restart(rows)),
        ("r3-trickle", lambda: trickled_body(gateway, rows)),
        ("r3-admin", lambda: admin_validation(gateway, rows)),
        ("r3-addresses", lambda: engine_addresses(gateway, rows)),
        ("r3-files", lambda: state_files(rows)),
    ]
