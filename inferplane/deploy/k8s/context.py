"""What every Kubernetes renderer shares: the fleet, the plan, the options, and workloads."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from inferplane.deploy.names import (
    LABEL_COMPONENT,
    LABEL_PART_OF,
    LABEL_WORKLOAD,
    PART_OF,
    gpu_groups,
    model_label,
    object_name,
)
from inferplane.deploy.options import RenderOptions, engine_image
from inferplane.errors import InferplaneError
from inferplane.planner.plan import Plan, PlanInstance
from inferplane.spec import FleetSpec

ENGINE_SERVICE_PORT = 8000
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"
LWS_SUFFIX = "-lws"  # the LWS controller names its headless Service after the LWS
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# A pod's own namespace, from the downward API: what the gateway watches and a picker's
# pool lives in. An overlay that moves the objects (kustomize `namespace:`) moves their
# Roles too, so a namespace written into the args would watch where they grant nothing.
POD_NAMESPACE_ENV = "POD_NAMESPACE"
POD_NAMESPACE = f"$({POD_NAMESPACE_ENV})"  # the kubelet expands it in args


def pod_namespace_env() -> dict[str, Any]:
    return {
        "name": POD_NAMESPACE_ENV,
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
    }


@dataclass(frozen=True)
class Workload:
    """One Deployment: identical pods, each running `members` (one, or a co-located group)."""

    name: str
    members: tuple[PlanInstance, ...]  # replica 0's instances, in start order
    replicas: int

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(inst.model for inst in self.members)

    @property
    def colocated(self) -> bool:
        return len(self.members) > 1

    @property
    def gpus(self) -> int:
        """GPUs per pod (the TP group on one node)."""
        return self.members[0].tensor_parallel_size

    @property
    def spans_nodes(self) -> bool:
        """A replica is a group of pods on several nodes: a LeaderWorkerSet, not a Deployment."""
        return self.members[0].spans_nodes

    @property
    def size(self) -> int:
        """Pods per replica: 1, or the nodes a replica spans (the LWS group size)."""
        return self.members[0].pipeline_parallel_size

    @property
    def api_version(self) -> str:
        return LWS_API_VERSION if self.spans_nodes else "apps/v1"

    @property
    def kind(self) -> str:
        return LWS_KIND if self.spans_nodes else "Deployment"

    def target_ref(self) -> dict[str, str]:
        """A scaleTargetRef: both kinds have a scale subresource."""
        return {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}


def _spanning(groups: list[list[PlanInstance]]) -> bool:
    """Whether a model's replicas span nodes; every replica must agree (one workload kind)."""
    sizes = {inst.pipeline_parallel_size for group in groups for inst in group}
    if len(sizes) > 1:
        first = groups[0][0]
        raise InferplaneError(
            f"the replicas of {first.model} span different numbers of nodes "
            f"({', '.join(str(s) for s in sorted(sizes))}); one workload cannot run them",
            field=f"plan.instances[{first.id}].pipeline_parallel_size",
            value=", ".join(str(s) for s in sorted(sizes)),
            fix="re-create the plan with `inferplane plan`",
        )
    if sizes == {1}:
        return False
    for group in groups:
        if len(group) > 1:
            raise InferplaneError(
                "a replica that spans nodes cannot share its GPUs with another model",
                field=f"plan.instances[{group[0].id}].shares_gpu_with",
                value=", ".join(inst.id for inst in group),
                fix="re-create the plan with `inferplane plan` (placement.colocate_with "
                    "needs single-node replicas)",
            )
    return True


@dataclass(frozen=True)
class K8sContext:
    fleet: FleetSpec
    plan: Plan
    options: RenderOptions

    @property
    def namespace(self) -> str:
        return self.options.namespace

    @property
    def image(self) -> str:
        engine = self.fleet.engine
        return engine_image(engine.kind, engine.version, engine.image, self.options, engine.device)

    @cached_property
    def workloads(self) -> list[Workload]:
        """Plan instances grouped into workloads: a Deployment per model or per co-located set,
        a LeaderWorkerSet per model whose replicas span nodes."""
        shapes: dict[tuple[str, ...], list[list[PlanInstance]]] = {}
        for group in gpu_groups(self.plan):
            shapes.setdefault(tuple(inst.model for inst in group), []).append(group)
        workloads: list[Workload] = []
        names: set[str] = set()
        for models, groups in shapes.items():
            groups.sort(key=lambda g: g[0].replica)
            name = object_name("-".join(models))
            if _spanning(groups):
                # Not the model's name: that is the model's Service, and the LWS controller
                # creates a headless Service named after the LWS (LWS_LEADER_ADDRESS).
                name = object_name("-".join(models) + LWS_SUFFIX)
            if name in names:
                raise InferplaneError(
                    "two workloads get the same Kubernetes name",
                    field="models",
                    value=name,
                    fix="rename one of the models so their names differ after '.' -> '-'",
                )
            names.add(name)
            workloads.append(Workload(name, tuple(groups[0]), len(groups)))
        services = {object_name(m.name) for m in self.fleet.models}
        for workload in workloads:
            if workload.spans_nodes and workload.name in services:
                raise InferplaneError(
                    "a LeaderWorkerSet would get the name of a model's Service (the LWS "
                    "controller creates a headless Service with its own name)",
                    field="models",
                    value=workload.name,
                    fix="rename the model whose name ends in -lws",
                )
        return sorted(workloads, key=lambda w: w.name)

    def workload_of(self, model: str) -> list[Workload]:
        return [w for w in self.workloads if model in w.models]

    def spans_nodes(self, model: str) -> bool:
        """The model's replicas are LWS groups: its Service and PodMonitor select leaders."""
        return any(w.spans_nodes for w in self.workload_of(model))

    @cached_property
    def models(self) -> list[str]:
        """Placed models that have at least one instance in the plan, in fleet order."""
        present = {inst.model for inst in self.plan.instances}
        return [m.name for m in self.fleet.models if m.name in present]

    def served_name(self, model: str) -> str:
        for inst in self.plan.instances:
            if inst.model == model:
                return inst.served_model_name
        return model

    def metadata(self, name: str, component: str, **labels: str) -> dict[str, Any]:
        merged = {**self.base_labels(component), **labels}
        return {"name": name, "namespace": self.namespace, "labels": merged}

    def base_labels(self, component: str) -> dict[str, str]:
        return {LABEL_PART_OF: PART_OF, LABEL_COMPONENT: component, **self.options.extra_labels}

    def pod_labels(self, workload: Workload) -> dict[str, str]:
        labels = {**self.base_labels("engine"), LABEL_WORKLOAD: workload.name}
        for model in workload.models:
            labels[model_label(model)] = "true"
        return labels

    def selector(self, workload: Workload) -> dict[str, str]:
        return {LABEL_PART_OF: PART_OF, LABEL_WORKLOAD: workload.name}

    def cpu_node_selector(self) -> dict[str, str]:
        """The labels every CPU node of the fleet file shares (none: any node)."""
        inventory = self.fleet.gpus
        label_sets = [dict(n.labels) for n in inventory.nodes] if inventory else []
        if not label_sets or not all(label_sets):
            return {}
        common = dict(label_sets[0])
        for labels in label_sets[1:]:
            common = {k: v for k, v in common.items() if labels.get(k) == v}
        return dict(sorted(common.items()))

    def node_selector(self, gpu_type: str) -> dict[str, str]:
        """Pin pods to nodes of the plan's GPU type (P14): the Kubernetes scheduler counts
        GPUs, not memory. Uses the node labels the fleet file gives for that type (all
        nodes' common labels), else `inferplane.io/gpu-type: <type>`."""
        inventory = self.fleet.gpus
        if inventory is not None:
            label_sets = [
                dict(node.labels) for node in inventory.nodes if node.gpu_type == gpu_type
            ]
            if label_sets and all(label_sets):
                common = dict(label_sets[0])
                for labels in label_sets[1:]:
                    common = {k: v for k, v in common.items() if labels.get(k) == v}
                if common:
                    return dict(sorted(common.items()))
        value = (
            gpu_type
            if _LABEL_VALUE.match(gpu_type) and len(gpu_type) <= 63
            else (object_name(gpu_type))
        )
        return {self.options.gpu_type_label: value}
