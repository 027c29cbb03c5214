"""Discovery sources by the name `inferplane gateway --discover NAME` takes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from inferplane.errors import InferplaneError
from inferplane.gateway.config import GatewayConfig
from inferplane.gateway.discovery import DiscoverySource

if TYPE_CHECKING:
    from inferplane.planner.plan import Plan


@dataclass(frozen=True)
class DiscoveryOptions:
    namespace: str | None = None  # Kubernetes: default in-cluster's / the context's
    kubeconfig: str | None = None  # Kubernetes: default KUBECONFIG or ~/.kube/config
    plan: Plan | None = None  # each discovered pod's cap from its plan instance


def _kubernetes(config: GatewayConfig, options: DiscoveryOptions) -> DiscoverySource:
    from inferplane.deploy.k8s.services import service_name
    from inferplane.gateway.discovery.kubernetes import KubernetesDiscovery
    from inferplane.gateway.discovery.plancaps import PlannedCaps

    services = {service_name(m.name): m.name for m in config.models}
    planned = PlannedCaps.from_plan(options.plan) if options.plan is not None else None
    return KubernetesDiscovery(services, options.namespace, kubeconfig=options.kubeconfig,
                               planned=planned)


SOURCES: dict[str, Callable[[GatewayConfig, DiscoveryOptions], DiscoverySource]] = {
    "kubernetes": _kubernetes,
}


def make_source(
    name: str, config: GatewayConfig, options: DiscoveryOptions | None = None
) -> DiscoverySource:
    factory = SOURCES.get(name)
    if factory is None:
        raise InferplaneError(
            "unknown discovery source",
            field="--discover",
            value=name,
            fix=f"use one of: {', '.join(sorted(SOURCES))}",
        )
    if not config.models:
        raise InferplaneError(
            "discovery needs the models to look for",
            field="--fleet",
            fix="give --fleet FLEET.yaml with --discover",
        )
    return factory(config, options or DiscoveryOptions())
