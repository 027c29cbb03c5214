"""The gateway side of discovery: snapshots become pool backends."""

from __future__ import annotations

from inferplane.gateway.backend import Backend, endpoint_backends
from inferplane.gateway.discovery import Snapshot
from inferplane.gateway.state import GatewayState


class StateSink:
    """Applies snapshots to a `GatewayState`. A model's static endpoints (fleet file,
    --backend) stay; discovered replicas are added after them. `Pool.set_backends` keys by
    URL, so a replica seen again keeps its counters, outlier state and engine reading, and
    requests in flight on a replica that left release the object they hold."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state
        self.static = {name: pool.route.endpoints for name, pool in state.pools.items()}

    def apply(self, snapshot: Snapshot) -> None:
        for model, replicas in snapshot.items():
            if model not in self.state.pools:
                continue
            backends = endpoint_backends(model, self.static[model])
            seen = {b.url for b in backends}
            for r in replicas:
                url = r.url.rstrip("/")
                if url in seen:
                    continue
                seen.add(url)
                backends.append(
                    Backend(url, ready=r.routable, max_concurrency=r.max_concurrency, name=r.name)
                )
            self.state.set_backends(model, backends)
