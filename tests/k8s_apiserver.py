"""A stand-in Kubernetes API server for EndpointSlices, speaking the real wire format.

No API server runs on these machines, so discovery is tested against this: the List
object with `metadata.resourceVersion`, watch streams of `{"type", "object"}` lines from
a resourceVersion (history replayed, then live events), `timeoutSeconds`, BOOKMARK-free
streams, an `ERROR` event with a `410 Expired` Status for a compacted version (what the
real server sends), a `401 Unauthorized` Status for a wrong bearer token, and set-based
label selectors (`key in (a,b)`, `key=value`). Every object it serves is first parsed by
the `kubernetes` client's own models, so a malformed fixture fails here, not in the gateway.
"""

from __future__ import annotations

import asyncio
import copy
import re
import socket
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from kubernetes.client import ApiClient

PATH = "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"
_SET = re.compile(r"^\s*([\w./-]+)\s+in\s+\(([^)]*)\)\s*$")


def _validate(obj: dict[str, Any], kind: str) -> None:
    ApiClient().deserialize(orjson.dumps(obj).decode(), kind, "application/json")


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


def _matches(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, (t.strip() for t in _split(selector))):
        m = _SET.match(term)
        if m:
            if labels.get(m.group(1)) not in {v.strip() for v in m.group(2).split(",")}:
                return False
        else:
            key, _, value = term.partition("=")
            if labels.get(key.strip()) != value.strip():
                return False
    return True


def _split(selector: str) -> list[str]:
    """Top-level commas only (not those inside `in (...)`)."""
    out, depth, cur = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return [*out, cur]


def endpoint(
    ip: str, pod: str, *, ready: bool = True, serving: bool | None = None,
    terminating: bool = False,
) -> dict[str, Any]:
    return {
        "addresses": [ip],
        "conditions": {"ready": ready, "serving": ready if serving is None else serving,
                       "terminating": terminating},
        "targetRef": {"kind": "Pod", "namespace": "ns", "name": pod, "uid": f"uid-{pod}"},
        "nodeName": "node-1",
    }


class FakeApiServer:
    def __init__(self, namespace: str = "ns", token: str = "good-token") -> None:
        self.namespace = namespace
        self.token = token
        self.version = 100
        self.slices: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.history: list[tuple[int, str, dict[str, Any]]] = []
        self.compacted = 0  # a watch from a version below this gets 410
        self.changed = asyncio.Condition()
        self.requests: list[str] = []  # "list" / "watch" / "401", in order
        self._drops = 0
        # Bound now (connections are refused until start()), so a kubeconfig can name it.
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kubeconfig(self, directory: Path, token: str | None = None) -> Path:
        cfg = {
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "gw", "user": {"token": token or self.token}}],
            "contexts": [{"name": "test", "context": {"cluster": "fake", "user": "gw",
                                                      "namespace": self.namespace}}],
        }
        path = directory / "kubeconfig"
        path.write_bytes(orjson.dumps(cfg))  # JSON is YAML
        return path

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get(PATH.format(ns="{ns}"), self._endpointslices)
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}", self._pod)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.SockSite(self._runner, self.sock).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self.drop_watches()
            await self._runner.cleanup()
            self._runner = None

    # ---- changing the cluster ------------------------------------------------------

    async def put_slice(
        self, name: str, service: str, port: int, endpoints: list[dict[str, Any]]
    ) -> None:
        obj = {
            "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
            "metadata": {"name": name, "namespace": self.namespace,
                         "labels": {"kubernetes.io/service-name": service,
                                    "endpointslice.kubernetes.io/managed-by":
                                        "endpointslice-controller.k8s.io"}},
            "addressType": "IPv4",
            "endpoints": endpoints,
            "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
        }
        await self._record("MODIFIED" if name in self.slices else "ADDED", name, obj)

    def put_pod(self, name: str, port: int, args: list[str],
                annotations: dict[str, str] | None = None) -> None:
        """The pod behind an endpoint, with its engine container's args."""
        obj = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": self.namespace, "uid": f"uid-{name}",
                            "resourceVersion": str(self.version),
                            "annotations": annotations or {}},
               "spec": {"containers": [
                   {"name": "sidecar", "image": "busybox", "args": ["--max-num-seqs", "7"]},
                   {"name": "engine", "image": "vllm/vllm-openai:v0.33.0", "args": args,
                    "ports": [{"name": "llama", "containerPort": port, "protocol": "TCP"}]},
               ]}}
        _validate(obj, "V1Pod")
        self.pods[name] = obj

    async def delete_slice(self, name: str) -> None:
        await self._record("DELETED", name, self.slices[name])

    async def _record(self, kind: str, name: str, obj: dict[str, Any]) -> None:
        self.version += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.version)
        _validate(obj, "V1EndpointSlice")
        if kind == "DELETED":
            self.slices.pop(name)
        else:
            self.slices[name] = obj
        self.history.append((self.version, kind, obj))
        async with self.changed:
            self.changed.notify_all()

    def expire(self) -> None:
        """Compact history: any watch from a version seen so far now gets 410 Gone."""
        self.compacted = self.version + 1
        self.history.clear()

    async def drop_watches(self) -> None:
        """End every open watch stream mid-way (an API server restart, a proxy timeout)."""
        self._drops += 1
        async with self.changed:
            self.changed.notify_all()

    # ---- the API ---------------------------------------------------------------------

    async def _endpointslices(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            self.requests.append("401")
            return web.json_response(_status(401, "Unauthorized", "Unauthorized"), status=401)
        if request.match_info["ns"] != self.namespace:
            return web.json_response({"kind": "EndpointSliceList", "apiVersion":
                                      "discovery.k8s.io/v1", "metadata":
                                      {"resourceVersion": str(self.version)}, "items": []})
        selector = request.query.get("labelSelector", "")
        if request.query.get("watch") in ("true", "1"):
            return await self._watch(request, selector)
        self.requests.append("list")
        items = []
        for obj in self.slices.values():
            if _matches(selector, obj["metadata"]["labels"]):
                item = copy.deepcopy(obj)
                del item["kind"], item["apiVersion"]  # list items carry neither
                items.append(item)
        body = {"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
                "metadata": {"resourceVersion": str(self.version)}, "items": items}
        _validate(body, "V1EndpointSliceList")
        return web.json_response(body)

    async def _pod(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response(_status(401, "Unauthorized", "Unauthorized"), status=401)
        self.requests.append("pod")
        obj = self.pods.get(request.match_info["name"])
        if obj is None or request.match_info["ns"] != self.namespace:
            name = request.match_info["name"]
            return web.json_response(_status(404, "NotFound", f'pods "{name}" not found'),
                                     status=404)
        return web.json_response(obj)

    async def _watch(self, request: web.Request, selector: str) -> web.StreamResponse:
        self.requests.append("watch")
        since = int(request.query.get("resourceVersion") or self.version)
        timeout = float(request.query.get("timeoutSeconds") or 1800)
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        if since < self.compacted:
            error = _status(410, "Expired", f"too old resource version: {since}")
            await resp.write(orjson.dumps({"type": "ERROR", "object": error}) + b"\n")
            return resp
        drops = self._drops
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        sent = since
        while drops == self._drops and loop.time() < deadline:
            for version, kind, obj in list(self.history):
                if version > sent and _matches(selector, obj["metadata"]["labels"]):
                    await resp.write(orjson.dumps({"type": kind, "object": obj}) + b"\n")
                sent = max(sent, version)
            async with self.changed:
                if self.version == sent and drops == self._drops:
                    try:
                        await asyncio.wait_for(self.changed.wait(), deadline - loop.time())
                    except TimeoutError:
                        break
        return resp
