"""EndpointSlices (discovery.k8s.io/v1) -> replicas: the pure half of Kubernetes discovery.

Rules from the EndpointSlice API: an unset `ready` or `serving` means ready ("consumers
should interpret this unknown state as ready"), an unset `terminating` means not
terminating; of an endpoint's `addresses` the first is used (they are fungible); the same
endpoint may sit in two slices for a moment while the controller rebalances them, so
endpoints are merged by URL and count as routable if any copy is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from inferplane.gateway.discovery import Replica

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
PORT_NAME = "http"  # the engine Services' port name (deploy/k8s/services.py)


def _port(slice_: Any) -> int | None:
    ports = slice_.ports or []
    for p in ports:
        if p.name == PORT_NAME and p.port is not None:
            return int(p.port)
    if len(ports) == 1 and ports[0].port is not None:
        return int(ports[0].port)
    return None


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def replicas_of(slices: Iterable[Any]) -> list[Replica]:
    """The replicas in one Service's slices (`V1EndpointSlice` objects), in a stable
    order (by name, then URL) so equal inputs give equal snapshots."""
    merged: dict[str, Replica] = {}
    for s in slices:
        port = _port(s)
        if port is None:
            continue  # no port yet: the controller has not resolved the named targetPort
        for ep in s.endpoints or []:
            if not ep.addresses:
                continue
            url = f"http://{_host(ep.addresses[0])}:{port}"
            cond = ep.conditions
            ready = cond is None or cond.ready is not False
            serving = cond is None or cond.serving is not False
            terminating = cond is not None and cond.terminating is True
            routable = ready and serving and not terminating
            ref = ep.target_ref
            name = (ref.name if ref is not None and ref.name else None) or ep.hostname or url
            old = merged.get(url)
            if old is None or (routable and not old.routable):
                merged[url] = Replica(url=url, name=name, routable=routable)
    return sorted(merged.values(), key=lambda r: (r.name, r.url))


def snapshot_of(
    slices: Iterable[Any], services: Mapping[str, str]
) -> dict[str, list[Replica]]:
    """`{model: replicas}` for every model in `services` (Service name -> model), from all
    watched slices; a model without slices gets an empty list (all its pods are gone)."""
    by_service: dict[str, list[Any]] = {svc: [] for svc in services}
    for s in slices:
        labels = (s.metadata.labels if s.metadata is not None else None) or {}
        svc = labels.get(SERVICE_NAME_LABEL)
        if svc in by_service:
            by_service[svc].append(s)
    return {model: replicas_of(by_service[svc]) for svc, model in services.items()}
