"""Scrape targets as Prometheus file_sd JSON, rewritten atomically when they change.

Prometheus re-reads a file_sd file when it changes (inotify, and every refresh interval),
so the runtime rewriting `targets/engines.json` as replicas start, stop or are added by
the autoscaler is all it takes to keep the scrape set current, with no reload.

Every target carries the labels the Kubernetes PrometheusRule and dashboard select and
group on, so one host's series look like a cluster's: `namespace` (the rules select
`namespace="..."`), `pod` (the instance name; alerts say which replica) and `component`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from inferplane.deploy.yamlio import write_atomic

GATEWAY_TARGETS = "targets/gateway.json"
ENGINES_TARGETS = "targets/engines.json"


@dataclass(frozen=True)
class Target:
    """One /metrics endpoint: `address` is host:port, `pod` the instance (or "gateway")."""

    address: str
    pod: str
    component: str  # "engine" | "gateway"
    model: str | None = None

    @classmethod
    def from_url(cls, url: str, pod: str, component: str, model: str | None = None) -> Target:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host = parts.hostname or "127.0.0.1"
        if host in ("0.0.0.0", "::"):  # listening everywhere: scrape it locally
            host = "127.0.0.1"
        return cls(f"{host}:{port}", pod, component, model)


def file_sd(targets: Iterable[Target], namespace: str) -> list[dict[str, Any]]:
    """One target group per endpoint (each has its own `pod` label), sorted for stable
    files. The model is `inferplane_model`, not `model`: the gateway's series already
    carry a `model` label and a target label would rename it."""
    groups = []
    for t in sorted(targets, key=lambda t: (t.component, t.pod)):
        labels = {"namespace": namespace, "pod": t.pod, "component": t.component}
        if t.model is not None:
            labels["inferplane_model"] = t.model
        groups.append({"targets": [t.address], "labels": labels})
    return groups


def engine_targets(instances: Sequence[dict[str, Any]]) -> list[Target]:
    """Targets from `state.json` instances (or `Supervised.to_json()` records)."""
    return [
        Target.from_url(str(i["url"]), str(i["name"]), "engine", str(i["model"]))
        for i in instances
        if i.get("url")
    ]


class TargetsWriter:
    """Keeps `DIR/targets/gateway.json` and `DIR/targets/engines.json` equal to the given
    targets; a file is rewritten (tmp + rename) only when its content changes."""

    def __init__(self, directory: Path, namespace: str) -> None:
        self.directory = directory
        self.namespace = namespace
        self._written: dict[str, str] = {}

    def update(self, gateway: Iterable[Target], engines: Iterable[Target]) -> bool:
        changed = False
        for name, targets in ((GATEWAY_TARGETS, gateway), (ENGINES_TARGETS, engines)):
            text = json.dumps(file_sd(targets, self.namespace), indent=2) + "\n"
            if self._written.get(name) != text:
                write_atomic(self.directory / name, text)
                self._written[name] = text
                changed = True
        return changed
