"""`render --check` for LeaderWorkerSets (replicas that span nodes, P13/P15).

No Kubernetes schema package knows the LWS CRD. Its own fields are checked against the
vendored `schemas/leaderworkerset-v1.json` (strict); each pod template as the `template` of a
core/v1 `PodTemplate` with `kubernetes-validate` (strict), so a typo in a container is caught
exactly as in a Deployment. For the semantic checks a LWS contributes two pod templates, with
the labels the LWS controller adds to its pods (`leaderworkerset.sigs.k8s.io/name`, and
`worker-index` 0 for leaders, 1.. for workers), so selectors are matched as the cluster will.
"""

from __future__ import annotations

from typing import Any

LWS_KEY = ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
LWS_SCHEMA = "schemas/leaderworkerset-v1.json"
NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
GPU_PREFIXES = ("nvidia.com/", "amd.com/gpu")

Template = tuple[str, dict[str, Any], dict[str, str]]  # role, PodTemplateSpec, injected labels


def is_lws(doc: dict[str, Any]) -> bool:
    return (str(doc.get("apiVersion")), str(doc.get("kind"))) == LWS_KEY


def _lwt(doc: dict[str, Any]) -> dict[str, Any]:
    lwt = (doc.get("spec") or {}).get("leaderWorkerTemplate") or {}
    return lwt if isinstance(lwt, dict) else {}


def size(doc: dict[str, Any]) -> int:
    value = _lwt(doc).get("size", 1)
    return value if isinstance(value, int) else 1


def pod_templates(doc: dict[str, Any]) -> list[Template]:
    """The leader's template (the worker's when there is none) and, for groups of more than
    one pod, the worker's; each with the labels the LWS controller puts on those pods."""
    name = str((doc.get("metadata") or {}).get("name", ""))
    lwt = _lwt(doc)
    worker = lwt.get("workerTemplate") if isinstance(lwt.get("workerTemplate"), dict) else {}
    leader = lwt.get("leaderTemplate") if isinstance(lwt.get("leaderTemplate"), dict) else worker
    out: list[Template] = [("leader", leader or {}, {NAME_LABEL: name, WORKER_INDEX_LABEL: "0"})]
    if size(doc) > 1:
        out.append(("worker", worker or {}, {NAME_LABEL: name, WORKER_INDEX_LABEL: "1"}))
    return out


def as_pod_template(doc: dict[str, Any], role: str, template: dict[str, Any]) -> dict[str, Any]:
    """A v1 PodTemplate wrapping one of the LWS's PodTemplateSpecs, for kubernetes-validate."""
    name = str((doc.get("metadata") or {}).get("name", "lws"))
    return {"apiVersion": "v1", "kind": "PodTemplate",
            "metadata": {"name": f"{name}-{role}"}, "template": template}


def _requests_gpu(template: dict[str, Any]) -> bool:
    for c in (template.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        if any(k.startswith(GPU_PREFIXES) for k in {*(res.get("requests") or {}),
                                                    *(res.get("limits") or {})}):
            return True
    return False


def problems(doc: dict[str, Any]) -> list[str]:
    """What no schema says about a GPU LeaderWorkerSet."""
    out: list[str] = []
    spec = doc.get("spec") or {}
    lwt = _lwt(doc)
    templates = pod_templates(doc)
    gpu = any(_requests_gpu(t) for _, t, _ in templates)
    if gpu and size(doc) > 1 and lwt.get("restartPolicy") != "RecreateGroupOnPodRestart":
        out.append("restartPolicy is not RecreateGroupOnPodRestart: a group that lost a "
                   "pod keeps the others waiting on a pipeline stage that is gone (P15)")
    rolling = ((spec.get("rolloutStrategy") or {}).get("rollingUpdateConfiguration") or {})
    if gpu and str(rolling.get("maxSurge", 0)) != "0":
        out.append("GPU LeaderWorkerSet without maxSurge: 0: the new group waits for the GPUs "
                   "the old one holds (P26)")
    leader_ready = any(c.get("readinessProbe") for c in
                       (templates[0][1].get("spec") or {}).get("containers") or [])
    if size(doc) > 1 and spec.get("startupPolicy") == "LeaderReady" and leader_ready:
        out.append("startupPolicy LeaderReady: workers start only after the leader is ready, "
                   "but the leader's engine is ready only once its workers joined")
    for role, template, _ in templates:
        for c in (template.get("spec") or {}).get("containers") or []:
            if role == "worker" and c.get("livenessProbe") and lwt.get(
                    "restartPolicy") == "RecreateGroupOnPodRestart":
                out.append(f"worker container {c.get('name')} has a liveness probe: one "
                           "failure while loading recreates the whole group (P24)")
        notes = (template.get("metadata") or {}).get("annotations") or {}
        if notes.get(GROUP_ANNOTATION):
            out.append(f"{role} template names PodGroup {notes[GROUP_ANNOTATION]}: every "
                       "group would join one gang; the LWS controller creates one per group")
    return out


__all__ = ["LWS_KEY", "LWS_SCHEMA", "NAME_LABEL", "WORKER_INDEX_LABEL", "Template",
           "as_pod_template", "is_lws", "pod_templates", "problems", "size"]
