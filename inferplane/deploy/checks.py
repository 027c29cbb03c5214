"""Validation of rendered output: real schemas plus inferplane's own semantic checks.

Kubernetes: every built-in object against the official OpenAPI-derived JSON schemas in
strict mode (`kubernetes-validate`) for each requested version; KEDA and
prometheus-operator objects through their generated pydantic models
(`cloudcoil-models-keda`, `cloudcoil-models-prometheus-operator`) with a round trip that
catches unknown fields; Volcano PodGroups and GIE InferencePools against the vendored CRD
schemas (`schemas/volcano-podgroup-v1beta1.json`, `schemas/inferencepool-v1.json`,
strict; the pool's CEL rules by hand); then the checks no schema expresses
(selectors match labels, scale targets exist, GPU requests = limits, quantities parse,
DNS-1123 names, port names <= 15 characters, one PDB per pod, drain and rollout settings,
PodGroups and PVCs that pods name exist, a PodGroup's GPUs match its pods).
LeaderWorkerSets (replicas that span nodes): see `lws_checks`.
Compose: the compose-spec JSON schema. systemd: `systemd-analyze verify` when present.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from inferplane.deploy import lws_checks
from inferplane.deploy.names import DNS1035_LABEL, IANA_SVC_NAME
from inferplane.deploy.yamlio import load_docs
from inferplane.engines import engine_for
from inferplane.errors import InferplaneError

DEFAULT_K8S_VERSIONS = ("1.29", "1.33")
QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?\d+)?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
GPU_PREFIXES = ("nvidia.com/", "amd.com/gpu")
WHOLE_GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")
HAMI_MEMORY = "nvidia.com/gpumem"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
_JSON_SCHEMAS: dict[tuple[str, str], str] = {
    ("scheduling.volcano.sh/v1beta1", "PodGroup"): "schemas/volcano-podgroup-v1beta1.json",
    ("inference.networking.k8s.io/v1", "InferencePool"): "schemas/inferencepool-v1.json",
}
_NAMED_BY_DNS1035 = {"Service"}


@dataclass(frozen=True)
class CheckProblem:
    file: str
    obj: str  # "Kind/name" or "" for the file as a whole
    message: str

    def render(self) -> str:
        where = f"{self.file}: {self.obj}" if self.obj else self.file
        return f"{where}: {self.message}"


Doc = tuple[str, dict[str, Any]]


def _kn(doc: dict[str, Any]) -> str:
    return f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"


# --- schemas ------------------------------------------------------------------------------

_CRD_MODELS: dict[tuple[str, str], tuple[str, str]] = {
    ("keda.sh/v1alpha1", "ScaledObject"): ("cloudcoil.models.keda.v1alpha1", "ScaledObject"),
    ("monitoring.coreos.com/v1", "PodMonitor"): (
        "cloudcoil.models.prometheus_operator.v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"): (
        "cloudcoil.models.prometheus_operator.v1", "PrometheusRule"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): (
        "cloudcoil.models.prometheus_operator.v1", "ServiceMonitor"),
}


def _first_difference(want: Any, got: Any, path: str = "") -> str | None:
    if isinstance(want, dict) and isinstance(got, dict):
        for key in sorted(want):
            if key not in got:
                return f"{path}.{key}".lstrip(".")
            diff = _first_difference(want[key], got[key], f"{path}.{key}")
            if diff:
                return diff
        return None
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return path.lstrip(".")
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            diff = _first_difference(a, b, f"{path}[{i}]")
            if diff:
                return diff
        return None
    return None if want == got and type(want) is type(got) else path.lstrip(".") or "."


def schema_problems(docs: list[Doc], versions: tuple[str, ...]) -> list[CheckProblem]:
    import importlib

    from pydantic import ValidationError

    problems: list[CheckProblem] = []
    for file, doc in docs:
        if doc.get("kind") == "Kustomization":
            continue
        key = (str(doc.get("apiVersion")), str(doc.get("kind")))
        if key in _JSON_SCHEMAS:
            problems += _json_schema_problems(file, doc, _JSON_SCHEMAS[key])
            continue
        if key in _CRD_MODELS:
            module, cls_name = _CRD_MODELS[key]
            model = getattr(importlib.import_module(module), cls_name)
            try:
                obj = model.model_validate(doc)
            except ValidationError as exc:
                first = exc.errors()[0]
                loc = ".".join(str(p) for p in first["loc"])
                problems.append(CheckProblem(file, _kn(doc), f"{loc}: {first['msg']}"))
                continue
            back = obj.model_dump(by_alias=True, exclude_unset=True, mode="json")
            diff = _first_difference(doc, back)
            if diff:
                problems.append(CheckProblem(
                    file, _kn(doc), f"unknown or mistyped field `{diff}` ({key[0]} {key[1]})"))
            continue
        if lws_checks.is_lws(doc):
            problems += _json_schema_problems(file, doc, lws_checks.LWS_SCHEMA)
            for role, template, _ in lws_checks.pod_templates(doc):
                wrapped = lws_checks.as_pod_template(doc, role, template)
                problems += _k8s_schema_problems(file, doc, wrapped, versions,
                                                 f"{role}Template as a PodTemplateSpec: ")
            continue
        problems += _k8s_schema_problems(file, doc, doc, versions)
    return problems


def _k8s_schema_problems(file: str, doc: dict[str, Any], obj: dict[str, Any],
                         versions: tuple[str, ...], prefix: str = "") -> list[CheckProblem]:
    import kubernetes_validate

    out: list[CheckProblem] = []
    key = (str(obj.get("apiVersion")), str(obj.get("kind")))
    for version in versions:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            out.append(CheckProblem(
                file, _kn(doc), f"no schema for {key[0]} {key[1]} in Kubernetes {version}"))
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            out.append(CheckProblem(
                file, _kn(doc), f"{prefix}Kubernetes {version}: {where}: {exc.message}"))
    return out


def _json_schema_problems(file: str, doc: dict[str, Any], schema_path: str) -> list[
        CheckProblem]:
    import json
    from importlib import resources

    import jsonschema

    schema = json.loads(resources.files("inferplane.deploy").joinpath(schema_path).read_text(
        encoding="utf-8"))
    validator = jsonschema.Draft7Validator(schema)
    return [
        CheckProblem(file, _kn(doc),
                     f"{'.'.join(str(p) for p in err.absolute_path) or '.'}: {err.message}")
        for err in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    ]


# --- semantic checks ------------------------------------------------------------------------


def _pod_templates(doc: dict[str, Any]) -> list[lws_checks.Template]:
    """(role, pod template, labels its controller adds to the pods) of a workload object."""
    if lws_checks.is_lws(doc):
        return lws_checks.pod_templates(doc)
    if doc.get("kind") in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        template = (doc.get("spec") or {}).get("template")
        return [("pod", template, {})] if isinstance(template, dict) else []
    return []


@dataclass(frozen=True)
class _Pod:
    file: str
    workload: dict[str, Any]
    role: str
    template: dict[str, Any]
    labels: dict[str, str]  # the template's and what the controller adds

    @property
    def owner(self) -> str:
        return _kn(self.workload) + ("" if self.role == "pod" else f" ({self.role}s)")

    def port_names(self) -> set[str]:
        return {p.get("name") for c in (self.template.get("spec") or {}).get("containers")
                or [] for p in c.get("ports") or []}


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _quantities(obj: Any, path: str, out: list[tuple[str, str]]) -> None:
    if isinstance(obj, dict):
        for key, value in obj.items():
            sub = f"{path}.{key}"
            if key in ("requests", "limits") and isinstance(value, dict):
                for res, qty in value.items():
                    out.append((f"{sub}.{res}", str(qty)))
            elif key == "sizeLimit":
                out.append((sub, str(value)))
            else:
                _quantities(value, sub, out)
    elif isinstance(obj, list):
        for i, item in enumerate(obj):
            _quantities(item, f"{path}[{i}]", out)


def _sleep_s(container: dict[str, Any]) -> int:
    pre = ((container.get("lifecycle") or {}).get("preStop") or {})
    command = (pre.get("exec") or {}).get("command") or []
    if len(command) == 2 and command[0] == "sleep" and str(command[1]).isdigit():
        return int(command[1])
    return int((pre.get("sleep") or {}).get("seconds", 0))


def _shutdown_timeout_s(container: dict[str, Any]) -> int:
    args = [str(a) for a in (container.get("command") or []) + (container.get("args") or [])]
    value = engine_for("vllm").planned(args).flag("shutdown-timeout")
    return int(value) if value and value.isdigit() else 0


def semantic_problems(docs: list[Doc]) -> list[CheckProblem]:
    problems: list[CheckProblem] = []

    def bad(file: str, doc: dict[str, Any], message: str) -> None:
        problems.append(CheckProblem(file, _kn(doc), message))

    pods: list[_Pod] = []
    seen: set[tuple[str, str, str]] = set()
    for file, doc in docs:
        kind = str(doc.get("kind"))
        meta = doc.get("metadata") or {}
        name = str(meta.get("name", ""))
        if kind == "Kustomization":
            continue
        pattern = DNS1035_LABEL if kind in _NAMED_BY_DNS1035 else DNS1123_SUBDOMAIN
        limit = 63 if kind in _NAMED_BY_DNS1035 else 253
        if not pattern.match(name) or len(name) > limit:
            bad(file, doc, f"name {name!r} is not a valid {kind} name")
        key = (kind, str(meta.get("namespace", "")), name)
        if key in seen:
            bad(file, doc, "duplicate object")
        seen.add(key)
        found: list[tuple[str, str]] = []
        _quantities(doc.get("spec"), "spec", found)
        for where, qty in found:
            if not QUANTITY.match(qty):
                bad(file, doc, f"{where}: {qty!r} is not a Kubernetes quantity")
        if lws_checks.is_lws(doc):
            for message in lws_checks.problems(doc):
                bad(file, doc, message)
        for role, template, injected in _pod_templates(doc):
            labels = {**((template.get("metadata") or {}).get("labels") or {}), **injected}
            pod = _Pod(file, doc, role, template, labels)
            pods.append(pod)
            _pod_problems(pod, bad)
    _reference_problems(docs, pods, bad, problems)
    return problems


Bad = Callable[[str, dict[str, Any], str], None]


def _pod_problems(pod: _Pod, bad: Bad) -> None:
    """One pod template: GPUs, ports, drain, probes, gang, rollout."""
    file, doc, template = pod.file, pod.workload, pod.template
    if pod.role == "pod":
        labels = (template.get("metadata") or {}).get("labels") or {}
        match = ((doc.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        if not _matches(match, labels):
            bad(file, doc, "spec.selector.matchLabels do not match the pod template labels")
    spec = template.get("spec") or {}
    containers = spec.get("containers") or []
    port_names: set[str] = set()
    gpu_containers = 0
    grace = int(spec.get("terminationGracePeriodSeconds", 30))
    for c in spec.get("initContainers") or []:
        res = c.get("resources") or {}
        if any(k.startswith(GPU_PREFIXES) for k in {*(res.get("requests") or {}),
                                                    *(res.get("limits") or {})}):
            bad(file, doc, f"init container {c.get('name')} requests a GPU: it holds the "
                           "card while the engine containers wait")
    for c in containers:
        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        gpu_keys = {k for k in {*req, *lim} if k.startswith(GPU_PREFIXES)}
        # Whole cards through the device plugin: a second request is a second card (P18).
        # A MIG slice or a HAMi virtual GPU (with gpumem) per container is intended.
        if (gpu_keys & set(WHOLE_GPU_RESOURCES)) and HAMI_MEMORY not in gpu_keys:
            gpu_containers += 1
        for res_key in sorted(gpu_keys):
            if str(req.get(res_key)) != str(lim.get(res_key)):
                bad(file, doc, f"container {c.get('name')}: {res_key} requests "
                               f"{req.get(res_key)} != limits {lim.get(res_key)}")
        for port in c.get("ports") or []:
            pname = port.get("name")
            if pname is None:
                continue
            if len(pname) > 15 or not IANA_SVC_NAME.match(pname):
                bad(file, doc, f"port name {pname!r} is not an IANA service name "
                               "(<= 15 chars, lowercase, a letter, no '--')")
            if pname in port_names:
                bad(file, doc, f"port name {pname!r} used twice in one pod")
            port_names.add(pname)
        needed = _sleep_s(c) + _shutdown_timeout_s(c)
        if needed and grace <= needed:
            bad(file, doc, f"container {c.get('name')}: terminationGracePeriodSeconds "
                           f"{grace} is not longer than preStop + drain ({needed} s, P27)")
        if gpu_keys and c.get("livenessProbe") and not c.get("startupProbe"):
            bad(file, doc, f"container {c.get('name')}: a liveness probe without a "
                           "startup probe kills models while they load (P24)")
    if gpu_containers > 1 and len(containers) > 1:
        bad(file, doc, f"{gpu_containers} containers request GPUs: the device plugin "
                       "gives each its own (P18)")
    # An LWS's pods get their group name from the LWS controller (one PodGroup per group).
    if pod.role == "pod" and spec.get("schedulerName") == "volcano" and not (
            (template.get("metadata") or {}).get("annotations") or {}).get(
            VOLCANO_GROUP_ANNOTATION):
        bad(file, doc, f"schedulerName volcano without a {VOLCANO_GROUP_ANNOTATION} "
                       "annotation: Volcano makes a PodGroup per pod, no gang (P15)")
    if gpu_containers and doc.get("kind") == "Deployment":
        strategy = (doc.get("spec") or {}).get("strategy") or {}
        rolling = strategy.get("rollingUpdate") or {}
        if strategy.get("type") != "Recreate" and str(rolling.get("maxSurge")) != "0":
            bad(file, doc, "GPU Deployment without maxSurge: 0 (or Recreate): the new "
                           "pod waits for the GPU the old one holds (P26)")


def _reference_problems(docs: list[Doc], pods: list[_Pod], bad: Bad,
                        problems: list[CheckProblem]) -> None:
    """What objects name: selectors, ports, claims, PodGroups, scale targets, PDB counts."""

    def pods_selected(selector: dict[str, str]) -> list[_Pod]:
        return [p for p in pods if _matches(selector, p.labels)]

    pdb_count: dict[str, int] = {}
    workloads = {(str(d.get("kind")), str((d.get("metadata") or {}).get("name"))) for _, d in docs}
    groups = {str((d.get("metadata") or {}).get("name")): d for _, d in docs
              if d.get("kind") == "PodGroup"}
    for pod in pods:
        file, doc, template = pod.file, pod.workload, pod.template
        tspec = template.get("spec") or {}
        for vol in tspec.get("volumes") or []:
            claim = (vol.get("persistentVolumeClaim") or {}).get("claimName")
            if claim and ("PersistentVolumeClaim", str(claim)) not in workloads:
                bad(file, doc, f"volume {vol.get('name')}: PersistentVolumeClaim {claim} "
                               "is not rendered here")
        group = ((template.get("metadata") or {}).get("annotations") or {}).get(
            VOLCANO_GROUP_ANNOTATION)
        if group is None or lws_checks.is_lws(doc):
            continue
        if group not in groups:
            bad(file, doc, f"PodGroup {group} named by {VOLCANO_GROUP_ANNOTATION} does not "
                           "exist")
            continue
        pg_spec = groups[group].get("spec") or {}
        pod_gpus = sum(int(((c.get("resources") or {}).get("requests") or {}).get(
            "nvidia.com/gpu", 0)) for c in tspec.get("containers") or [])
        want = int(pg_spec.get("minMember", 0)) * pod_gpus
        have = int((pg_spec.get("minResources") or {}).get("nvidia.com/gpu", 0))
        if have != want:
            bad(file, doc, f"PodGroup {group} minResources nvidia.com/gpu {have} != minMember "
                           f"x the pod's GPUs ({want})")
    lws_names = {str((d.get("metadata") or {}).get("name")) for _, d in docs
                 if lws_checks.is_lws(d)}
    for file, doc in docs:
        kind = str(doc.get("kind"))
        spec = doc.get("spec") or {}
        if kind == "Service" and str((doc.get("metadata") or {}).get("name")) in lws_names:
            bad(file, doc, "has the name of a LeaderWorkerSet, whose controller creates a "
                           "headless Service of that name for LWS_LEADER_ADDRESS")
        if kind == "Service" and spec.get("selector"):
            selected = pods_selected(spec["selector"])
            if not selected:
                bad(file, doc, "selector matches no pod template")
            for port in spec.get("ports") or []:
                target = port.get("targetPort")
                for pod in selected:
                    if isinstance(target, str) and target not in pod.port_names():
                        bad(file, doc, f"targetPort {target!r} is not a port of {pod.owner}")
        if kind in ("PodDisruptionBudget", "PodMonitor"):
            selector = (spec.get("selector") or {}).get("matchLabels") or {}
            selected = pods_selected(selector)
            if not selected:
                bad(file, doc, "selector matches no pod template")
            if kind == "PodDisruptionBudget":
                for pod in selected:
                    pdb_count[pod.owner] = pdb_count.get(pod.owner, 0) + 1
            else:
                for endpoint in spec.get("podMetricsEndpoints") or []:
                    for pod in selected:
                        if endpoint.get("port") not in pod.port_names():
                            bad(file, doc, f"port {endpoint.get('port')!r} is not a port "
                                           f"of {pod.owner}")
        if kind == "InferencePool":
            _pool_problems(file, doc, pods_selected, bad)
        if kind in ("ScaledObject", "HorizontalPodAutoscaler"):
            ref = spec.get("scaleTargetRef") or {}
            if (str(ref.get("kind", "Deployment")), str(ref.get("name"))) not in workloads:
                bad(file, doc, f"scale target {ref.get('kind', 'Deployment')}/"
                               f"{ref.get('name')} does not exist")
    for owner, count in sorted(pdb_count.items()):
        if count > 1:
            problems.append(CheckProblem("", owner, f"{count} PodDisruptionBudgets select its "
                                                 "pods; the eviction API refuses such pods"))


def _pool_problems(file: str, doc: dict[str, Any],
                   pods_selected: Callable[[dict[str, str]], list[_Pod]], bad: Bad) -> None:
    """The InferencePool CRD's CEL rules (a JSON schema has none) and what it selects."""
    spec = doc.get("spec") or {}
    numbers = [p.get("number") for p in spec.get("targetPorts") or []]
    if len(numbers) != len(set(numbers)):
        bad(file, doc, "spec.targetPorts: port number must be unique")
    ref = spec.get("endpointPickerRef") or {}
    if ref and ref.get("kind", "Service") == "Service" and "port" not in ref:
        bad(file, doc, "spec.endpointPickerRef: port is required when kind is 'Service'")
    selected = pods_selected((spec.get("selector") or {}).get("matchLabels") or {})
    if not selected:
        bad(file, doc, "selector matches no pod template")
    for pod in selected:
        ports = {p.get("containerPort") for c in (pod.template.get("spec") or {}).get(
            "containers") or [] for p in c.get("ports") or []}
        for number in numbers:
            if number not in ports:
                bad(file, doc, f"targetPort {number} is not a container port of {pod.owner}")


# --- directories ----------------------------------------------------------------------------


def load_k8s_dir(path: Path) -> tuple[list[Doc], list[CheckProblem]]:
    kfile = path / "kustomization.yaml"
    problems: list[CheckProblem] = []
    kust = load_docs(kfile.read_text(encoding="utf-8"))
    resources = (kust[0] if kust else {}).get("resources") or []
    docs: list[Doc] = []
    for rel in resources:
        file = path / rel
        if not file.is_file():
            problems.append(CheckProblem("kustomization.yaml", "", f"resource {rel} is missing"))
            continue
        try:
            docs += [(rel, d) for d in load_docs(file.read_text(encoding="utf-8"))]
        except yaml.YAMLError as exc:
            problems.append(CheckProblem(rel, "", f"not YAML: {exc}"))
    return docs, problems


def check_k8s_dir(path: Path, versions: tuple[str, ...] = DEFAULT_K8S_VERSIONS) -> list[
        CheckProblem]:
    docs, problems = load_k8s_dir(path)
    return problems + schema_problems(docs, versions) + semantic_problems(docs)


def check_dir(path: Path, versions: tuple[str, ...] = DEFAULT_K8S_VERSIONS) -> list[
        CheckProblem]:
    """Validate a rendered directory of any target; an empty list means it passed."""
    if not path.is_dir():
        raise InferplaneError("not a directory", field="--check", value=str(path),
                              fix="give the directory `inferplane render --out` wrote")
    if (path / "kustomization.yaml").is_file():
        return check_k8s_dir(path, versions)
    composes = sorted(path.rglob("compose.yaml"))
    if composes:
        from inferplane.deploy.compose import check_compose_file

        return [p for f in composes for p in check_compose_file(f, path)]
    units = sorted(path.rglob("*.service"))
    if units:
        from inferplane.deploy.systemd import check_units

        return check_units(path)
    raise InferplaneError(
        "no rendered files found (kustomization.yaml, compose.yaml or *.service)",
        field="--check", value=str(path),
        fix="render first: inferplane render FLEET.yaml --target k8s --out DIR",
    )


def systemd_analyze() -> str | None:
    return shutil.which("systemd-analyze")


def run_quiet(argv: list[str], timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
