"""Where engine pods read model weights from (P35).

`--weights none` (default): a local `source` is a `hostPath` at the same path, a Hugging Face
id uses a shared node cache. `--weights pvc`: one ReadOnlyMany PersistentVolumeClaim per
model (pre-populated by you: the model directory, or for a Hugging Face id the
`models--org--name` cache directory), mounted read-only. `--weights prewarm`: a DaemonSet per
model copies the weights from the model store (NFS at `source`, or the Hub) to node-local
disk under `prewarm_dir` once; engine pods wait for that copy in an init container and
mount it read-only, so their startup budget counts local-disk reads only (P24).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from inferplane.deploy.k8s.context import K8sContext
from inferplane.deploy.names import LABEL_PART_OF, LABEL_WORKLOAD, PART_OF, object_name
from inferplane.errors import InferplaneError

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
HF_CACHE_HOST = "/var/lib/inferplane/hf-cache"
HF_CACHE_MOUNT = "/root/.cache/huggingface"
PREWARM_MOUNT = "/prewarm"
SOURCE_MOUNT = "/source"


@dataclass(frozen=True)
class WeightsMount:
    """One model's weights in an engine container: a volume, where it goes, extra env."""

    volume: dict[str, Any]
    mount: dict[str, Any]
    env: dict[str, str]


def volume_name(model: str) -> str:
    return object_name(f"weights-{model}", max_chars=63)


def hub_dir(repo_id: str) -> str:
    """The Hugging Face cache directory of a repo: `models--org--name`."""
    return "models--" + repo_id.replace("/", "--")


def local_name(model: str) -> str:
    return object_name(model, max_chars=63)


def weights_bytes(ctx: K8sContext, model: str) -> int:
    return max(inst.weights_bytes for inst in ctx.plan.instances_of(model))


def engine_mount(ctx: K8sContext, model: str) -> WeightsMount | None:
    """The weights mount for one model, or None when it has no source or uses the shared
    Hugging Face cache (`--weights none`)."""
    spec = ctx.fleet.model(model)
    if spec is None or not spec.source:
        return None
    mode = ctx.options.weights
    local_path = spec.source.startswith("/")
    if mode == "none" and not local_path:
        return None
    name = volume_name(model)
    if local_path:
        target, env = spec.source, {}
    else:
        target = f"{HF_CACHE_MOUNT}/hub/{hub_dir(spec.source)}"
        env = {"HF_HUB_OFFLINE": "1"}  # the cache is read-only and complete
    if mode == "none":
        volume = {"name": name, "hostPath": {"path": spec.source, "type": "Directory"}}
    elif mode == "pvc":
        volume = {"name": name,
                  "persistentVolumeClaim": {"claimName": name, "readOnly": True}}
    else:
        path = f"{ctx.options.prewarm_dir.rstrip('/')}/{local_name(model)}"
        if not local_path:
            path += f"/hub/{hub_dir(spec.source)}"
        volume = {"name": name, "hostPath": {"path": path, "type": "Directory"}}
    return WeightsMount(volume, {"name": name, "mountPath": target, "readOnly": True}, env)


def uses_hf_cache(ctx: K8sContext, model: str) -> bool:
    spec = ctx.fleet.model(model)
    return (ctx.options.weights == "none" and spec is not None and bool(spec.source)
            and not str(spec.source).startswith("/"))


def prewarmed_models(ctx: K8sContext) -> list[str]:
    if ctx.options.weights != "prewarm":
        return []
    return [m for m in ctx.models if (spec := ctx.fleet.model(m)) is not None and spec.source]


def _marker(model: str) -> str:
    return f"{PREWARM_MOUNT}/{local_name(model)}.complete"


def wait_init_container(ctx: K8sContext, models: list[str]) -> dict[str, Any]:
    """Engine pods start only after the node's pre-warm copy is complete (P35)."""
    budget = sum(ctx.options.copy_budget_s(weights_bytes(ctx, m)) for m in models)
    lines = ["set -eu", "i=0"]
    for model in models:
        spec = ctx.fleet.model(model)
        assert spec is not None and spec.source
        marker = _marker(model)
        lines.append(
            f'until [ "$(cat {marker} 2>/dev/null)" = {shlex.quote(spec.source)} ]; do '
            f'i=$((i + 5)); if [ "$i" -gt {budget} ]; then '
            f'echo "weights of {model} not pre-warmed on this node after {budget} s" >&2; '
            "exit 1; fi; sleep 5; done"
        )
    return {
        "name": "wait-weights",
        "image": ctx.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", "\n".join(lines) + "\n"],
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
        "volumeMounts": [{"name": "prewarm", "mountPath": PREWARM_MOUNT, "readOnly": True}],
    }


def prewarm_root_volume(ctx: K8sContext) -> dict[str, Any]:
    return {"name": "prewarm",
            "hostPath": {"path": ctx.options.prewarm_dir, "type": "DirectoryOrCreate"}}


def copy_script(ctx: K8sContext, model: str, *, root: str = PREWARM_MOUNT,
                source_dir: str = SOURCE_MOUNT) -> str:
    """Idempotent: copy into `<dir>.partial`, rename, then write the source to the marker.

    `root` is the pre-warm directory and `source_dir` a local source as the copier sees
    them (a container's mounts by default; the host's own paths for systemd)."""
    spec = ctx.fleet.model(model)
    assert spec is not None and spec.source
    dst = f"{root.rstrip('/')}/{local_name(model)}"
    src = shlex.quote(spec.source)
    lines = [
        "set -eu",
        f'if [ "$(cat {dst}.complete 2>/dev/null)" = {src} ]; then '
        f'echo "{model}: already on this node"; exit 0; fi',
        f"rm -rf {dst}.partial {dst}.complete",
        f"mkdir -p {dst}.partial",
    ]
    if spec.source.startswith("/"):
        lines.append(f"cp -a {shlex.quote(source_dir.rstrip('/'))}/. {dst}.partial/")
    else:
        fetch = ("import sys; from huggingface_hub import snapshot_download; "
                 "snapshot_download(sys.argv[1])")
        lines.append(f"HF_HOME={dst}.partial python3 -c {shlex.quote(fetch)} {src}")
    lines += [
        f"rm -rf {dst}",
        f"mv {dst}.partial {dst}",
        f"printf %s {src} > {dst}.complete",
        f'echo "{model}: copied to $(du -sh {dst} | cut -f1)"',
    ]
    return "\n".join(lines) + "\n"


def _gpu_type(ctx: K8sContext, model: str) -> str:
    return ctx.plan.instances_of(model)[0].gpu_type


def prewarm_daemonset(ctx: K8sContext, model: str) -> dict[str, Any]:
    """Runs on every node of the model's GPU type (any of them may get a replica)."""
    spec = ctx.fleet.model(model)
    assert spec is not None and spec.source
    name = object_name(f"prewarm-{model}", max_chars=63)
    labels = {**ctx.base_labels("prewarm"), LABEL_WORKLOAD: name}
    mounts: list[dict[str, Any]] = [{"name": "prewarm", "mountPath": PREWARM_MOUNT}]
    volumes: list[dict[str, Any]] = [prewarm_root_volume(ctx)]
    if spec.source.startswith("/"):
        mounts.append({"name": "source", "mountPath": SOURCE_MOUNT, "readOnly": True})
        volumes.append({"name": "source",
                        "hostPath": {"path": spec.source, "type": "Directory"}})
    hold = "trap 'exit 0' TERM; while true; do sleep 3600 & wait $!; done\n"
    pod: dict[str, Any] = {
        "initContainers": [{
            "name": "copy",
            "image": ctx.image,
            "imagePullPolicy": "IfNotPresent",
            "command": ["/bin/sh", "-c", copy_script(ctx, model)],
            "resources": {"requests": {"cpu": "1", "memory": "2Gi"}},
            "volumeMounts": mounts,
        }],
        "containers": [{
            "name": "hold",
            "image": ctx.image,
            "imagePullPolicy": "IfNotPresent",
            "command": ["/bin/sh", "-c", hold],
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
        }],
        "enableServiceLinks": False,
        "nodeSelector": ctx.node_selector(_gpu_type(ctx, model)),
        "tolerations": [GPU_TOLERATION],
        "terminationGracePeriodSeconds": 5,
        "volumes": volumes,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": ctx.metadata(name, "prewarm"),
        "spec": {
            "selector": {"matchLabels": {LABEL_PART_OF: PART_OF, LABEL_WORKLOAD: name}},
            "updateStrategy": {"type": "RollingUpdate",
                               "rollingUpdate": {"maxUnavailable": "25%"}},
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def pvc(ctx: K8sContext, model: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "accessModes": ["ReadOnlyMany"],
        "resources": {"requests": {
            "storage": f"{ctx.options.weights_volume_gib(weights_bytes(ctx, model))}Gi"}},
        "volumeMode": "Filesystem",
    }
    if ctx.options.weights_storage_class is not None:
        spec["storageClassName"] = ctx.options.weights_storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": ctx.metadata(volume_name(model), "weights"),
        "spec": spec,
    }


def pvc_models(ctx: K8sContext) -> list[str]:
    if ctx.options.weights != "pvc":
        return []
    out = [m for m in ctx.models if (spec := ctx.fleet.model(m)) is not None and spec.source]
    names = [volume_name(m) for m in out]
    if len(set(names)) != len(names):
        raise InferplaneError("two models get the same weights volume name", field="models",
                              value=", ".join(out),
                              fix="rename one so their names differ after '.' -> '-'")
    return out


__all__ = ["HF_CACHE_HOST", "HF_CACHE_MOUNT", "WeightsMount", "copy_script", "engine_mount",
           "hub_dir", "local_name",
           "prewarm_daemonset", "prewarm_root_volume", "prewarmed_models", "pvc",
           "pvc_models", "uses_hf_cache", "volume_name", "wait_init_container"]


ADAPTER_MOUNT = "/adapters"  # where `--weights pvc` mounts each adapter in the container
ADAPTER_SUBDIR = "lora"  # each adapter's folder on the model's weights volume (pvc)


@dataclass(frozen=True)
class AdapterMount:
    """One LoRA adapter directory in an engine container."""

    volume: dict[str, Any] | None  # None: it comes from the model's weights volume
    mount: dict[str, Any]
    host_path: str  # the adapter's source, as the plan's argv names it
    container_path: str


def adapter_mounts(ctx: K8sContext, model: str) -> list[AdapterMount]:
    """The model's adapters: `--weights pvc` reads each from the model's own weights volume
    (`lora/<adapter name>` on it, mounted under /adapters); otherwise each directory is a
    hostPath at the same path (`prewarm` copies the model only: adapters are small)."""
    spec = ctx.fleet.model(model)
    if spec is None or spec.lora is None:
        return []
    out: list[AdapterMount] = []
    for index, adapter in enumerate(spec.lora.adapters):
        if ctx.options.weights == "pvc":
            if adapter.name.startswith("/") or ".." in adapter.name.split("/"):
                raise InferplaneError(
                    "an adapter name that is not a plain path on the weights volume",
                    field="models.lora.adapters.name", value=adapter.name,
                    fix="name it without '..' or a leading '/' (it is lora/<name> on the "
                        "volume)",
                )
            target = f"{ADAPTER_MOUNT}/{object_name(adapter.name, max_chars=63)}-{index}"
            out.append(AdapterMount(None, {
                "name": volume_name(model), "mountPath": target,
                "subPath": f"{ADAPTER_SUBDIR}/{adapter.name}", "readOnly": True,
            }, adapter.source, target))
            continue
        name = object_name(f"lora-{model}-{index}", max_chars=63)
        out.append(AdapterMount(
            {"name": name, "hostPath": {"path": adapter.source, "type": "Directory"}},
            {"name": name, "mountPath": adapter.source, "readOnly": True},
            adapter.source, adapter.source,
        ))
    return out


__all__ += ["ADAPTER_MOUNT", "ADAPTER_SUBDIR", "AdapterMount", "adapter_mounts"]
