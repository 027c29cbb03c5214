"""The simulated engine's sockets send each token at once (TCP_NODELAY), like vLLM's server:
with Nagle's algorithm on, a reused connection's first chunk waits for the client's
delayed ACK and benchmarks read ~20-40 ms of false TTFT."""

from __future__ import annotations

import socket

from inferplane.sim.host import _bind


def test_accepted_connections_have_nodelay() -> None:
    listener = _bind("127.0.0.1", 0)
    try:
        listener.setblocking(True)
        client = socket.create_connection(listener.getsockname()[:2])
        accepted, _ = listener.accept()
        with client, accepted:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        listener.close()
