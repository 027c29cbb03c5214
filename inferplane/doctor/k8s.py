"""Reading a pod for `diagnose --pod` and cluster facts for `doctor --k8s`, behind a small
interface so tests replay recorded API responses.

`ClusterApi` is the handful of reads inferplane needs, each returning plain JSON (what
`kubectl get -o json` prints); `KubernetesApi` implements it with the official client,
imported only when used. `RecordedApi` replays a directory of recorded responses.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from inferplane.errors import InferplaneError

Json = dict[str, Any]


class ClusterApi(Protocol):
    def pod(self, namespace: str, name: str) -> Json: ...
    def pod_log(self, namespace: str, name: str, container: str | None, previous: bool,
                tail_lines: int) -> str: ...
    def events(self, namespace: str, name: str) -> list[Json]: ...
    def nodes(self) -> list[Json]: ...
    def pods(self) -> list[Json]: ...


class KubernetesApi:
    """`ClusterApi` over the official `kubernetes` client (kubeconfig or in-cluster)."""

    def __init__(self) -> None:
        try:
            from kubernetes import client, config
        except ImportError:
            raise InferplaneError(
                # shared by `diagnose --pod` and `doctor --k8s`: name the package, not a flag
                "the Kubernetes client (the kubernetes package) is not installed",
                field="kubernetes",
                fix="pip install -e '.[k8s]' in a source checkout, else pip install "
                "'inferplane[k8s]' (or: pip install kubernetes)",
            ) from None
        try:
            config.load_kube_config()
        except Exception:  # no kubeconfig: try the pod's service account
            try:
                config.load_incluster_config()
            except Exception as exc:
                raise InferplaneError(
                    "no Kubernetes configuration found", field="kubeconfig",
                    value=str(exc).splitlines()[0] if str(exc) else "none",
                    fix="set KUBECONFIG or run inside the cluster",
                ) from None
        self._core = client.CoreV1Api()
        self._plain = client.ApiClient().sanitize_for_serialization

    def pod(self, namespace: str, name: str) -> Json:
        return dict(self._plain(self._core.read_namespaced_pod(name, namespace)))

    def pod_log(self, namespace: str, name: str, container: str | None, previous: bool,
                tail_lines: int) -> str:
        kwargs: dict[str, Any] = {"previous": previous, "tail_lines": tail_lines}
        if container:
            kwargs["container"] = container
        return str(self._core.read_namespaced_pod_log(name, namespace, **kwargs))

    def events(self, namespace: str, name: str) -> list[Json]:
        found = self._core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name}"
        )
        return list(self._plain(found).get("items", []))

    def nodes(self) -> list[Json]:
        return list(self._plain(self._core.list_node()).get("items", []))

    def pods(self) -> list[Json]:
        return list(self._plain(self._core.list_pod_for_all_namespaces()).get("items", []))


class RecordedApi:
    """`ClusterApi` over recorded responses: `pod.json`, `events.json`, `nodes.json`,
    `pods.json` (the `items` of a list), `log.txt` and `log.previous.txt`."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory

    def _json(self, name: str, default: Any) -> Any:
        path = self.dir / name
        return json.loads(path.read_text()) if path.is_file() else default

    def pod(self, namespace: str, name: str) -> Json:
        return dict(self._json("pod.json", {}))

    def pod_log(self, namespace: str, name: str, container: str | None, previous: bool,
                tail_lines: int) -> str:
        path = self.dir / ("log.previous.txt" if previous else "log.txt")
        if not path.is_file():
            return ""
        return "\n".join(path.read_text().splitlines()[-tail_lines:])

    def events(self, namespace: str, name: str) -> list[Json]:
        return list(self._json("events.json", {"items": []})["items"])

    def nodes(self) -> list[Json]:
        return list(self._json("nodes.json", {"items": []})["items"])

    def pods(self) -> list[Json]:
        return list(self._json("pods.json", {"items": []})["items"])


def parse_pod_ref(ref: str) -> tuple[str, str]:
    namespace, sep, name = ref.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise InferplaneError(
            "expected NAMESPACE/POD", field="--pod", value=ref, fix="e.g. --pod inference/vllm-0"
        )
    return namespace, name


def _event_line(event: Json) -> str:
    count = event.get("count") or 1
    times = f" (x{count})" if count > 1 else ""
    source = (event.get("source") or {}).get("component") or event.get("reportingComponent", "")
    return (f"  {event.get('type', 'Normal')}  {event.get('reason', '')}{times}  {source}  "
            f"{event.get('message', '').strip()}")


def _status_lines(pod: Json) -> list[str]:
    lines = []
    status = pod.get("status") or {}
    if status.get("phase"):
        lines.append(f"Status: {status['phase']}")
    for cs in status.get("containerStatuses") or []:
        lines.append(f"  Container {cs.get('name')}: restarts {cs.get('restartCount', 0)}")
        for label, state in (("State", cs.get("state") or {}),
                             ("Last State", cs.get("lastState") or {})):
            for kind, detail in state.items():
                lines.append(f"    {label}: {kind}")
                if detail.get("reason"):
                    lines.append(f"      Reason: {detail['reason']}")
                if detail.get("exitCode") is not None:
                    lines.append(f"      Exit Code: {detail['exitCode']}")
    return lines


def _engine_container(pod: Json) -> str | None:
    """With several containers the log API needs a name: the one that requests GPUs (the
    engine), else the first. None for a single container."""
    containers = (pod.get("spec") or {}).get("containers") or []
    if len(containers) < 2:
        return None
    for c in containers:
        limits = ((c.get("resources") or {}).get("limits") or {})
        if limits.get("nvidia.com/gpu"):
            return str(c.get("name"))
    return str(containers[0].get("name"))


def pod_text(api: ClusterApi, namespace: str, name: str, *, container: str | None = None,
             tail_lines: int = 5000) -> str:
    """One text to diagnose: the pod's state and events the way `kubectl describe` prints
    them, the previous container's log (after a restart) and the current log."""
    pod = api.pod(namespace, name)
    container = container or _engine_container(pod)
    parts = [f"# pod {namespace}/{name}", *_status_lines(pod), "Events:"]
    parts += [_event_line(e) for e in api.events(namespace, name)]
    restarted = any((cs.get("restartCount") or 0) > 0
                    for cs in (pod.get("status") or {}).get("containerStatuses") or [])
    if restarted:
        previous = api.pod_log(namespace, name, container, True, tail_lines)
        if previous:
            parts += ["# log of the previous container", previous]
    current = api.pod_log(namespace, name, container, False, tail_lines)
    if current:
        parts += ["# log", current]
    return "\n".join(parts) + "\n"
