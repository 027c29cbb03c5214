"""Kubernetes discovery: list and watch the EndpointSlices of each model's Service.

The official `kubernetes` client (the `[k8s]` extra) is synchronous, so the list/watch
loop runs in a daemon thread and hands each snapshot to the event loop; its models
(`V1EndpointSlice`) parse every object the API server sends. The loop is the informer
pattern: list (a full snapshot, replacing whatever was known), then watch from the list's
resourceVersion; a watch that ends is resumed from the last version seen; a `410 Gone`
(the version expired) or any error relists, with exponential backoff after failures. The
last good snapshot stays in force while the API server is unreachable (as kube-proxy
does), so an API outage never takes replicas away.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from inferplane.errors import InferplaneError
from inferplane.gateway.discovery import DiscoveryStatus, Replica, ReplicaSink, Snapshot
from inferplane.gateway.discovery.plancaps import PlannedCaps, combined
from inferplane.gateway.discovery.podcaps import max_num_seqs
from inferplane.gateway.discovery.slices import SERVICE_NAME_LABEL, snapshot_of

log = logging.getLogger(__name__)

SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
HTTP_GONE = 410


def _client() -> Any:
    try:
        import kubernetes
    except ImportError as exc:
        raise InferplaneError(
            "Kubernetes discovery needs the kubernetes client",
            field="--discover",
            value="kubernetes",
            fix="pip install 'inferplane[k8s]' (the gateway image has it)",
        ) from exc
    return kubernetes


def load_configuration(kubeconfig: str | None = None) -> tuple[Any, str | None]:
    """(client Configuration, the namespace it implies): in-cluster when running in a pod
    (KUBERNETES_SERVICE_HOST set) and no kubeconfig is given, else KUBECONFIG or
    ~/.kube/config (its current context's namespace)."""
    k8s = _client()
    cfg = k8s.client.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            k8s.config.load_incluster_config(client_configuration=cfg)
        except k8s.config.ConfigException as exc:
            raise InferplaneError(
                "no in-cluster Kubernetes configuration",
                field="--discover",
                value="kubernetes",
                fix="give the pod a ServiceAccount token (automountServiceAccountToken: "
                f"true), or unset KUBERNETES_SERVICE_HOST and set KUBECONFIG ({exc})",
            ) from exc
        ns = SA_NAMESPACE.read_text().strip() if SA_NAMESPACE.exists() else None
        return cfg, ns
    # Read now, not at the client's import (its default is fixed when it is imported).
    kubeconfig = kubeconfig or os.environ.get("KUBECONFIG") or None
    try:
        k8s.config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        _, current = k8s.config.list_kube_config_contexts(config_file=kubeconfig)
    except (k8s.config.ConfigException, OSError) as exc:
        raise InferplaneError(
            "no Kubernetes configuration",
            field="--discover",
            value="kubernetes",
            fix=f"run in a pod with a ServiceAccount, or set KUBECONFIG ({exc})",
        ) from exc
    ns = (current or {}).get("context", {}).get("namespace")
    return cfg, ns


class KubernetesDiscovery:
    """`services` maps each model's Service name (the renderer's) to the model."""

    name = "kubernetes"

    def __init__(
        self,
        services: Mapping[str, str],
        namespace: str | None = None,
        *,
        kubeconfig: str | None = None,
        watch_timeout_s: int = 300,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        planned: PlannedCaps | None = None,
    ) -> None:
        self.services = dict(services)
        self.planned = planned  # the plan's caps per pod (plancaps.py); None: pods' own
        cfg, implied = load_configuration(kubeconfig)
        self.namespace = namespace or implied or "default"
        k8s = _client()
        self._k8s = k8s
        api_client = k8s.client.ApiClient(cfg)
        self._api = k8s.client.DiscoveryV1Api(api_client)
        self._core = k8s.client.CoreV1Api(api_client)
        # (pod name, URL) -> its cap (plan and --max-num-seqs; None: neither, or unreadable).
        self._caps: dict[tuple[str, str], int | None] = {}
        self._pods_forbidden_logged = False
        self.selector = f"{SERVICE_NAME_LABEL} in ({','.join(sorted(self.services))})"
        self.watch_timeout_s = watch_timeout_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._status = DiscoveryStatus(self.name, synced=False, error="not listed yet")
        self._stop = threading.Event()
        self._watch: Any = None
        self._thread: threading.Thread | None = None
        self._delay = backoff_s  # the next retry's wait; doubles per failure in a row

    def status(self) -> DiscoveryStatus:
        return self._status

    async def start(self, sink: ReplicaSink) -> None:
        loop = asyncio.get_running_loop()
        self._thread = threading.Thread(
            target=self._run, args=(loop, sink), name="inferplane-k8s-discovery", daemon=True
        )
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        # The thread is a daemon and leaves at its next event, timeout or error; waiting
        # for a watch to time out would hold the gateway's shutdown for minutes.

    def _run(self, loop: asyncio.AbstractEventLoop, sink: ReplicaSink) -> None:
        self._delay = self.backoff_s
        while not self._stop.is_set():
            try:
                self._list_and_watch(loop, sink)
            except Exception as exc:
                if self._stop.is_set():
                    return
                delay = self._delay
                self._delay = min(self.max_backoff_s, delay * 2)
                gone = isinstance(exc, self._k8s.client.ApiException) and exc.status == HTTP_GONE
                if gone:  # the version expired (compaction): not a failure, but relist
                    log.info("kubernetes discovery: watch expired (410 Gone), relisting "
                             "in %.1f s", delay)
                else:
                    why = _describe(exc)
                    self._status = DiscoveryStatus(self.name, self._status.synced, why)
                    log.warning(
                        "kubernetes discovery: endpointslices in namespace %s: %s "
                        "(retrying in %.1f s)", self.namespace, why, delay,
                    )
                self._stop.wait(delay)

    def _list_and_watch(self, loop: asyncio.AbstractEventLoop, sink: ReplicaSink) -> None:
        timeout = (5.0, self.watch_timeout_s + 30.0)  # (connect, read) seconds
        listed = self._api.list_namespaced_endpoint_slice(
            self.namespace, label_selector=self.selector, _request_timeout=timeout
        )
        known: dict[str, Any] = {s.metadata.name: s for s in listed.items}
        version = listed.metadata.resource_version
        self._publish(loop, sink, known)
        if self._status.error is not None or not self._status.synced:
            log.warning(
                "kubernetes discovery: listed %d endpointslices in namespace %s",
                len(known), self.namespace,
            )
        self._status = DiscoveryStatus(self.name, synced=True)
        self._delay = self.backoff_s  # a good list ends a run of failures
        while not self._stop.is_set():
            self._watch = w = self._k8s.watch.Watch()
            for event in w.stream(
                self._api.list_namespaced_endpoint_slice,
                self.namespace,
                label_selector=self.selector,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=self.watch_timeout_s,
                _request_timeout=timeout,
            ):
                kind, obj = event["type"], event["object"]
                if kind == "BOOKMARK":
                    version = w.resource_version
                    continue
                if kind == "DELETED":
                    known.pop(obj.metadata.name, None)
                elif kind in ("ADDED", "MODIFIED"):
                    known[obj.metadata.name] = obj
                else:
                    continue
                version = obj.metadata.resource_version
                self._publish(loop, sink, known)
            # The server closed the watch (its timeout, a restart): resume from `version`.

    def _publish(
        self, loop: asyncio.AbstractEventLoop, sink: ReplicaSink, known: Mapping[str, Any]
    ) -> None:
        snapshot = self._with_caps(snapshot_of(known.values(), self.services))
        try:
            loop.call_soon_threadsafe(sink.apply, snapshot)
        except RuntimeError:  # the loop is closed: the gateway has shut down
            self._stop.set()

    def _with_caps(self, snapshot: dict[str, list[Replica]]) -> Snapshot:
        """Each replica's cap from its pod (read once per pod): its plan instance's
        max_num_seqs and its own --max-num-seqs (`plancaps.py`, `podcaps.py`)."""
        out = {model: [replace(r, max_concurrency=self._cap(r, model)) for r in replicas]
               for model, replicas in snapshot.items()}
        live = {(r.name, r.url) for replicas in snapshot.values() for r in replicas}
        self._caps = {k: v for k, v in self._caps.items() if k in live}
        return out

    def _cap(self, r: Replica, model: str) -> int | None:
        key = (r.name, r.url)
        if key in self._caps:
            return self._caps[key]
        port = urlsplit(r.url).port
        if r.name == r.url or port is None:  # no pod named by the endpoint
            return None
        try:
            pod = self._core.read_namespaced_pod(r.name, self.namespace,
                                                 _request_timeout=(5.0, 10.0))
        except self._k8s.client.ApiException as exc:
            if exc.status == 403 and not self._pods_forbidden_logged:
                self._pods_forbidden_logged = True
                log.warning("kubernetes discovery: may not read pods (RBAC: get on pods); "
                            "discovered replicas get the model's default cap")
            if exc.status in (403, 404):
                self._caps[key] = None
            return None
        except Exception:  # unreachable for now: asked again on the next event
            return None
        own = max_num_seqs(pod, port)
        planned = self.planned.cap(pod, model) if self.planned is not None else None
        if planned is not None and own is not None and planned != own:
            log.warning("kubernetes discovery: pod %s runs --max-num-seqs %d, its plan "
                        "instance %d (a rollout in progress, or a hand edit): capped at %d",
                        r.name, own, planned, min(own, planned))
        cap = self._caps[key] = combined(planned, own)
        return cap


def _describe(exc: Exception) -> str:
    status = getattr(exc, "status", None)
    if isinstance(status, int) and status:
        hint = {401: " (the token is wrong or expired)",
                403: " (RBAC: the gateway's Role needs get/list/watch on endpointslices)"}
        return f"HTTP {status} {getattr(exc, 'reason', '')}{hint.get(status, '')}".strip()
    return f"cannot reach the API server: {type(exc).__name__}: {exc}"[:300]
