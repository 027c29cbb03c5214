"""Apply a rendered Kubernetes directory with the official client: server-side apply,
every object dry-run first, then for real (nothing is applied when any dry run fails)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inferplane.deploy.checks import load_k8s_dir
from inferplane.errors import InferplaneError

FIELD_MANAGER = "inferplane"
# What installs the API of each custom kind `render` may write.
_PROVIDERS = {
    "LeaderWorkerSet": "the LeaderWorkerSet controller (github.com/kubernetes-sigs/lws)",
    "ScaledObject": "KEDA (or render with --autoscaler hpa)",
    "PodMonitor": "the Prometheus Operator",
    "PrometheusRule": "the Prometheus Operator",
    "PodGroup": "Volcano (or render without --gang volcano)",
    "InferencePool": "the Gateway API Inference Extension CRDs "
                     "(github.com/kubernetes-sigs/gateway-api-inference-extension, or render "
                     "without --inference-pool)",
}


def _client() -> Any:
    try:
        from kubernetes import config
        from kubernetes.client import ApiClient
        from kubernetes.config.config_exception import ConfigException
        from kubernetes.dynamic import DynamicClient
    except ImportError as exc:
        raise InferplaneError(
            "the Kubernetes client is not installed", field="apply",
            fix="pip install kubernetes (or apply with: kubectl apply --server-side -k DIR)",
        ) from exc
    try:
        config.load_incluster_config()
    except ConfigException:
        try:
            config.load_kube_config()
        except (ConfigException, OSError, TypeError) as exc:
            raise InferplaneError(
                "no Kubernetes cluster is configured (no in-cluster service account and no "
                "usable kubeconfig)", field="KUBECONFIG",
                fix="point KUBECONFIG at a cluster's config, or use `kubectl config use-context`",
            ) from exc
    return DynamicClient(ApiClient())


def apply_dir(path: Path, *, dry_run_only: bool = False) -> list[str]:
    """Apply every object `kustomization.yaml` lists; return 'Kind/name' of each."""
    if not (path / "kustomization.yaml").is_file():
        raise InferplaneError("not a rendered Kubernetes directory", field="DIR",
                              value=str(path), fix="render with --target k8s first")
    docs, problems = load_k8s_dir(path)
    if problems:
        raise InferplaneError(problems[0].render(), field="DIR", value=str(path),
                              fix="re-render the directory")
    client = _client()
    passes = [True] if dry_run_only else [True, False]
    applied: list[str] = []
    for dry in passes:
        for _, doc in docs:
            meta = doc["metadata"]
            resource = _resource(client, doc)
            extra = {"dry_run": "All"} if dry else {}
            client.server_side_apply(
                resource, body=doc, name=meta["name"], namespace=meta.get("namespace"),
                field_manager=FIELD_MANAGER, force_conflicts=True, **extra,
            )
            if not dry or dry_run_only:
                applied.append(f"{doc['kind']}/{meta['name']}")
    return applied


def _resource(client: Any, doc: dict[str, Any]) -> Any:
    from kubernetes.dynamic.exceptions import ResourceNotFoundError

    try:
        return client.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
    except ResourceNotFoundError as exc:
        kind = str(doc["kind"])
        raise InferplaneError(
            f"the cluster has no API for {doc['apiVersion']} {kind}; nothing was applied",
            field="DIR", value=f"{kind}/{doc['metadata']['name']}",
            fix=f"install {_PROVIDERS.get(kind, 'the CRD that defines it')} first",
        ) from exc
