"""Kubernetes-safe names and labels derived from fleet names."""

from __future__ import annotations

import hashlib
import re

from inferplane.planner.plan import Plan, PlanInstance

PART_OF = "inferplane"
LABEL_MODEL_PREFIX = "model.inferplane.io/"  # one label per model a pod serves
LABEL_WORKLOAD = "inferplane.io/workload"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_NAME = "app.kubernetes.io/name"
# On every engine pod: the plan instance ids it runs (comma-separated; a label value cannot
# hold a list). The gateway matches discovered pods to the plan by it.
ANNOTATION_INSTANCES = "inferplane.io/instances"
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
IANA_SVC_NAME = re.compile(r"^(?=.*[a-z])[a-z0-9]([a-z0-9]|-(?=[a-z0-9]))*$")


def _short_hash(text: str, chars: int = 5) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:chars]


def object_name(text: str, max_chars: int = 52) -> str:
    """A DNS-1035 label (valid for every object kind, Services included).

    Dots become '-', a leading digit gets an `m-` prefix; names longer than `max_chars`
    (52 leaves room for the suffixes controllers append) keep a hash of the original.
    """
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower())
    name = re.sub(r"-{2,}", "-", name).strip("-") or "x"
    if not name[0].isalpha():
        name = f"m-{name}"
    if len(name) > max_chars:
        name = f"{name[: max_chars - 6].rstrip('-')}-{_short_hash(text)}"
    return name


def port_name(model: str) -> str:
    """The container port name of one model's engine: an IANA service name (<= 15 chars).

    The same in every pod serving the model, so the model's Service can target it by name
    whether the pod is the model's own or shared with another model (S0).
    """
    name = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")
    name = re.sub(r"-{2,}", "-", name)
    if len(name) <= 15 and IANA_SVC_NAME.match(name):
        return name
    head = name[:9].strip("-") or "m"
    if not re.search(r"[a-z]", head):
        head = f"m{head[:8]}"
    return f"{head}-{_short_hash(model)}"


def model_label(model: str) -> str:
    return f"{LABEL_MODEL_PREFIX}{model}"


def gpu_groups(plan: Plan) -> list[list[PlanInstance]]:
    """Instances that share GPUs, as connected groups in start order (P18–P20).

    A group of one is a plain instance. Within a group, an instance comes after those in
    its `start_after`; ties keep plan order. CPU engines that share cores on one host
    (`colocate_with`) are separate workloads: a pod gets its own cores from the kubelet.
    """
    if plan.device == "cpu":
        return [[inst] for inst in plan.instances]
    by_id = {inst.id: inst for inst in plan.instances}
    parent = {inst.id: inst.id for inst in plan.instances}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for inst in plan.instances:
        for other in inst.shares_gpu_with:
            if other in by_id:
                parent[find(other)] = find(inst.id)
    groups: dict[str, list[PlanInstance]] = {}
    for inst in plan.instances:
        groups.setdefault(find(inst.id), []).append(inst)
    ordered: list[list[PlanInstance]] = []
    for members in groups.values():
        ordered.append(_start_order(members))
    return ordered


def _start_order(members: list[PlanInstance]) -> list[PlanInstance]:
    ids = {m.id for m in members}
    done: list[PlanInstance] = []
    remaining = list(members)
    while remaining:
        for inst in remaining:
            deps = [d for d in inst.start_after if d in ids]
            if all(any(d == x.id for x in done) for d in deps):
                done.append(inst)
                remaining.remove(inst)
                break
        else:  # a cycle: keep plan order rather than loop forever
            done.extend(remaining)
            break
    return done


def group_name(group: list[PlanInstance]) -> str:
    """Workload name: the instance id, or `<first>--<second>` for a co-located pod."""
    return object_name("--".join(inst.id for inst in group) if len(group) > 1 else group[0].id)
