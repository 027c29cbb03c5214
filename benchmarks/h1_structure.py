"""CPU per request of the native protocol's own structure (`gateway/h1.py`), alone: 32
keep-alive connections each sending POST /v1/chat/completions, answered by an app that
reads the body, waits one loop pass (the upstream's place) and responds, with no gateway
logic. A fake transport takes the writes, so what is timed is the parser callbacks, the
request objects, the task(s), receive/send and the loop. The app offers `native_entry`,
so a tree whose protocol has one takes it; an older tree serves it through ASGI.

    PYTHONPATH=<tree> python benchmarks/h1_structure.py [requests] [label]

Prints CPU µs per request (`time.process_time`) for 9 runs, min and median: compare trees
run one after another on the same CPU (`taskset -c 0`); the absolute number is this
box's, not the gateway's.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import uvloop

from inferplane.gateway.asgi import Receive, Scope, Send, respond
from inferplane.gateway.connections import CONNECTION, Connections
from inferplane.gateway.h1 import protocol_for

REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer k\r\n"
    b'Content-Type: application/json\r\nContent-Length: 13\r\n\r\n{"model":"m"}'
)
CONNS = 32


class Sink(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes += 1

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default


async def _handle(receive: Receive, send: Send, conn: Any) -> None:
    await receive()
    conn.on_lost = lambda: None  # as the proxy sets it
    await asyncio.sleep(0)  # the upstream's wait
    await respond(send, 200, b'{"ok":true}', b"rid-1", extra=[(b"x-a", b"1")])
    conn.on_lost = None


class App:
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _handle(receive, send, scope[CONNECTION])

    def native_entry(self) -> Any:
        async def entry(
            path: str, headers: list[tuple[bytes, bytes]], receive: Receive, send: Send,
            conn: Any,
        ) -> None:  # fmt: skip
            await _handle(receive, send, conn)

        return entry


async def _run(requests: int) -> float:
    cls = protocol_for(Connections(), App(), None)
    conns = []
    for _ in range(CONNS):
        proto, sink = cls(), Sink()
        proto.connection_made(sink)
        conns.append((proto, sink))
    t0 = time.process_time()
    for _ in range(requests // CONNS):
        for proto, _sink in conns:
            proto.data_received(REQUEST)
        while any(proto.current is not None for proto, _sink in conns):
            await asyncio.sleep(0)
    spent = time.process_time() - t0
    assert all(sink.writes == requests // CONNS for _proto, sink in conns)
    for proto, _sink in conns:
        proto.connection_lost(None)
    return spent / requests * 1e6


def main() -> None:
    requests = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    label = sys.argv[2] if len(sys.argv) > 2 else ""
    runs = [uvloop.run(_run(requests)) for _ in range(9)]
    listed = " ".join(f"{r:.2f}" for r in runs)
    print(f"{label} {listed} min {min(runs):.2f} median {sorted(runs)[4]:.2f} µs/request")


if __name__ == "__main__":
    main()
