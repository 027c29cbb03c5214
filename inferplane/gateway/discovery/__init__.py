"""Replica discovery: sources that tell the gateway which replicas each model has.

The seam is small on purpose. A source (`DiscoverySource`) watches something (the
Kubernetes API today) and hands complete snapshots, `{model: [Replica, ...]}`, to a
`ReplicaSink`; the gateway's sink (`sink.StateSink`) turns them into pool backends. A new
source is one module with a factory plus one line in `SOURCES` (`registry.py`).

A snapshot is the whole truth for the models it names: a replica missing from it is gone,
so a source that relists after an error can never leave a stale replica or add one twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Replica:
    """One replica of a model as a source sees it.

    url: base URL without /v1 (e.g. http://10.0.3.7:8000); name: what logs, metrics and
    x-inferplane-replica show (the pod's name); routable: False while the replica is not
    ready or is draining (terminating): it gets no new requests, those in flight finish.
    """

    url: str
    name: str
    routable: bool
    max_concurrency: int | None = None


Snapshot = Mapping[str, Sequence[Replica]]


class ReplicaSink(Protocol):
    def apply(self, snapshot: Snapshot) -> None:
        """Replace the discovered replicas of every model in `snapshot` (loop thread)."""


@dataclass(frozen=True, slots=True)
class DiscoveryStatus:
    """synced: the source has listed at least once (its replicas are known); error: the
    last failure since the last success, for /ready and the log."""

    source: str
    synced: bool
    error: str | None = None


class DiscoverySource(Protocol):
    name: str

    async def start(self, sink: ReplicaSink) -> None:
        """Begin watching; returns at once (the first list may still be failing)."""

    async def stop(self) -> None: ...

    def status(self) -> DiscoveryStatus: ...
