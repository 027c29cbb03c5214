"""Knobs of the renderers that are not in the fleet file, with the defaults the seeds learned."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Literal

from inferplane.deploy.images import PROJECT_IMAGE
from inferplane.engines import engine_for
from inferplane.errors import InferplaneError

Autoscaler = Literal["keda", "hpa", "none"]
WeightsMode = Literal["none", "pvc", "prewarm"]
GangScheduler = Literal["none", "kueue", "volcano"]
WEIGHTS_MODES: tuple[WeightsMode, ...] = ("none", "pvc", "prewarm")
GANG_SCHEDULERS: tuple[GangScheduler, ...] = ("none", "kueue", "volcano")

GIB = 2**30
MIB = 2**20
_DNS1123 = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
MIN_K8S_VERSION = (1, 25)  # policy/v1 PDB, autoscaling/v2 HPA


@dataclass(frozen=True)
class RenderOptions:
    """Everything a renderer needs besides the fleet and the plan.

    Startup budget (P24): `startup_overhead_s + weights / disk_read_mib_s`, times
    `startup_safety`, at least `startup_min_s`. With the defaults a 34 GB MoE gets ~600 s,
    what S0 needed for Qwen3.6-35B-A3B.
    Drain (P27): endpoints drop during `prestop_sleep_s`, vLLM then drains for `drain_s`,
    and the grace period is both plus `grace_margin_s`.
    Weights (P35): `weights="pvc"` mounts a ReadOnlyMany PVC per model (size = weights x
    `weights_headroom`, class `weights_storage_class`); `weights="prewarm"` copies them to
    node-local disk under `prewarm_dir` first, so the engine's budget uses
    `local_read_mib_s` instead of `disk_read_mib_s`.
    Gang scheduling (P15): `gang` puts multi-GPU workloads under Kueue (`gang_queue` is the
    LocalQueue) or Volcano (`gang_queue` is the Volcano Queue of their PodGroups).
    """

    namespace: str = "inferplane"
    k8s_version: str = "1.30"
    disk_read_mib_s: float = 200.0
    startup_overhead_s: float = 240.0  # CUDA init, torch.compile, graph capture
    startup_safety: float = 1.5
    startup_min_s: int = 300
    probe_period_s: int = 10
    prestop_sleep_s: int = 15
    drain_s: int = 300
    grace_margin_s: int = 30
    nofile: int = 65536  # P30
    autoscaler: Autoscaler = "keda"
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    gateway_image: str = PROJECT_IMAGE  # what the repository's Dockerfile builds
    gateway_replicas: int = 2
    ingress_host: str | None = None
    ingress_class: str = "nginx"
    gpu_type_label: str = "inferplane.io/gpu-type"
    fleet_text: str | None = None  # the fleet file as written, shipped to the gateway
    fleet_file_path: str = "/etc/inferplane/fleet.yaml"  # where compose/systemd gateways read it
    extra_labels: dict[str, str] = field(default_factory=dict)
    weights: WeightsMode = "none"
    weights_storage_class: str | None = None  # None: the cluster's default class
    weights_headroom: float = 1.2  # PVC size over the weights: tokenizer, configs, slack
    prewarm_dir: str = "/var/lib/inferplane/models"
    local_read_mib_s: float = 2000.0  # node-local NVMe after the pre-warm copy
    gang: GangScheduler = "none"
    gang_queue: str = "default"
    inference_pool: bool = False  # GIE v1 InferencePools per model (k8s/inference_pool.py)
    epp_image: str | None = None  # with inference_pool: run an endpoint picker per pool

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", self.namespace) or len(
            self.namespace
        ) > 63:
            raise InferplaneError(
                "not a valid Kubernetes namespace",
                field="--namespace",
                value=self.namespace,
                fix="use lowercase letters, digits and '-', at most 63 characters",
            )
        if k8s_minor(self.k8s_version) < MIN_K8S_VERSION:
            raise InferplaneError(
                "Kubernetes version too old for the rendered APIs (policy/v1, autoscaling/v2)",
                field="--k8s-version",
                value=self.k8s_version,
                fix="use 1.25 or newer, e.g. --k8s-version 1.30",
            )
        if self.gateway_replicas < 2:
            raise InferplaneError(
                "the gateway needs at least 2 replicas to survive a node drain",
                field="gateway_replicas",
                value=self.gateway_replicas,
                fix="use 2 or more",
            )
        if self.weights not in WEIGHTS_MODES:
            raise InferplaneError(
                "unknown weights mode", field="--weights", value=self.weights,
                fix=f"use one of: {', '.join(WEIGHTS_MODES)}",
            )
        if self.gang not in GANG_SCHEDULERS:
            raise InferplaneError(
                "unknown gang scheduler", field="--gang", value=self.gang,
                fix=f"use one of: {', '.join(GANG_SCHEDULERS)}",
            )
        for name, value in (("--gang-queue", self.gang_queue),
                            ("--weights-storage-class", self.weights_storage_class)):
            if value is not None and (not _DNS1123.fullmatch(value) or len(value) > 63):
                raise InferplaneError(
                    "not a valid Kubernetes object name", field=name, value=value,
                    fix="use lowercase letters, digits, '-' and '.', at most 63 characters",
                )
        if self.epp_image is not None and not self.inference_pool:
            raise InferplaneError(
                "an endpoint picker serves an InferencePool", field="--epp-image",
                value=self.epp_image, fix="add --inference-pool, or drop --epp-image",
            )
        if self.weights_headroom < 1.0:
            raise InferplaneError(
                "the weights volume must be at least as large as the weights",
                field="weights_headroom", value=self.weights_headroom, fix="use 1.0 or more",
            )
        if not self.prewarm_dir.startswith("/") or self.prewarm_dir.rstrip("/") == "":
            raise InferplaneError(
                "the pre-warm directory must be an absolute path below /",
                field="prewarm_dir", value=self.prewarm_dir,
                fix="use a directory on local SSD, e.g. /var/lib/inferplane/models",
            )
        if self.local_read_mib_s <= 0:
            raise InferplaneError(
                "disk bandwidth must be positive", field="local_read_mib_s",
                value=self.local_read_mib_s, fix="give the local disk's read speed, e.g. 2000",
            )
        if self.disk_read_mib_s <= 0:
            raise InferplaneError(
                "disk bandwidth must be positive",
                field="--disk-read-mib-s",
                value=self.disk_read_mib_s,
                fix="give the measured read speed of the model store, e.g. 200",
            )

    # --- derived numbers ----------------------------------------------------------------

    def startup_budget_s(self, weights_bytes: int, *, local: bool = False) -> int:
        """Seconds a replica may take to load before the startup probe gives up (P24).

        `local`: the weights were pre-warmed to node-local disk (P35) before the container
        started, so they load at `local_read_mib_s`."""
        speed = self.local_read_mib_s if local else self.disk_read_mib_s
        load_s = weights_bytes / (speed * MIB)
        budget = (self.startup_overhead_s + load_s) * self.startup_safety
        period = self.probe_period_s
        return max(self.startup_min_s, math.ceil(budget / period) * period)

    def copy_budget_s(self, weights_bytes: int) -> int:
        """Seconds the pre-warm copy from the model store may take (P35): the slow read at
        `disk_read_mib_s`, times `startup_safety`, at least `startup_min_s`."""
        copy_s = weights_bytes / (self.disk_read_mib_s * MIB) * self.startup_safety
        return max(self.startup_min_s, math.ceil(copy_s / 60) * 60)

    def weights_volume_gib(self, weights_bytes: int) -> int:
        """Size of a model's ReadOnlyMany weights PVC (P35), whole GiB."""
        return max(1, math.ceil(weights_bytes * self.weights_headroom / GIB))

    def grace_s(self) -> int:
        """terminationGracePeriodSeconds: longer than preStop sleep plus the drain (P27)."""
        return self.prestop_sleep_s + self.drain_s + self.grace_margin_s


def k8s_minor(version: str) -> tuple[int, int]:
    match = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.\d+)?", version.strip())
    if not match:
        raise InferplaneError(
            "not a Kubernetes version",
            field="--k8s-version",
            value=version,
            fix="use MAJOR.MINOR, e.g. 1.30",
        )
    return int(match.group(1)), int(match.group(2))


def engine_image(kind: str, version: str, image: str | None, options: RenderOptions,
                 device: str = "gpu") -> str:
    """The fleet's `engine.image`, else the engine's own (the project's image for the sim,
    vLLM's CPU image for device cpu)."""
    if image:
        return image
    return engine_for(kind, device).image(version, fallback=options.gateway_image)


def supports_shutdown_timeout(kind: str, version: str) -> bool:
    """Whether the engine drains in-flight requests on SIGTERM for a given time (P27)."""
    return engine_for(kind).supports_drain_timeout(version)
