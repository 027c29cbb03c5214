"""`lint` for hand-written Kubernetes manifests: probes that kill a model while it loads (P24).

The fleet file has no probes - `inferplane render` sizes them - but people run `vllm serve`
from their own Deployments, StatefulSets and LeaderWorkerSets. For every container whose
command runs vLLM, the model it names is looked up locally (a path, `--models-root`, or the
Hugging Face cache; never downloaded), its weights sized by the estimator, and the load
time estimated the way the renderer budgets its startup probe
(`RenderOptions.startup_budget_s`): `startup_overhead_s + weights / disk_read_mib_s`
expected, times `startup_safety` (at least `startup_min_s`) recommended.

A probe's budget is `initialDelaySeconds + failureThreshold x periodSeconds` (Kubernetes
defaults 0, 3, 10). Advice:

- a startupProbe whose budget is below the expected load time (warn) or below the
  recommended one (info), with the failureThreshold that gives the recommended budget;
- a livenessProbe without a startupProbe: it runs from the start, so its budget is the
  time the model has to load (warn when short, info otherwise);
- no readinessProbe: the Service sends requests to a pod that is still loading (info);
- --gpu-memory-utilization above the safe band for the model (P06: 0.90, 0.85 for big 8-bit
  models; warn).

A container of a `vllm/vllm-openai*` image with no `command:` runs the image's entrypoint,
the OpenAI API server, with `args:` as its flags - the way vLLM's own docs write it.

An unknown model is still checked against the overhead alone (CUDA init, compile, graph
capture: a lower bound), and the advice says the weights were not counted.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from inferplane.deploy.options import RenderOptions
from inferplane.doctor.lint import Advice
from inferplane.errors import InferplaneError

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
K8S_DEFAULTS = {"initialDelaySeconds": 0, "periodSeconds": 10, "failureThreshold": 3}
# Images whose entrypoint is vLLM's OpenAI API server (any registry, tag or -rocm/-cpu suffix).
_API_SERVER_IMAGE = re.compile(r"(?:^|/)vllm/vllm-openai[\w.-]*(?::[\w.-]+)?(?:@\S+)?$")
UTILIZATION_BAND = 0.90  # P06 without a model: BF16/FP16 models of any size


@dataclass(frozen=True)
class EngineContainer:
    """One container that runs `vllm serve` (or vLLM's OpenAI API server module)."""

    file: str
    workload: str  # e.g. Deployment/qwen3-30b, LeaderWorkerSet/ds-r1 (leader)
    container: str
    model: str | None  # as the command names it; None: not given (or from a variable)
    args: tuple[str, ...]
    spec: dict[str, Any]

    def where(self, probe: str) -> str:
        return f"{self.file}: {self.workload} container {self.container}: {probe}"


@dataclass(frozen=True)
class LoadTime:
    expected_s: float  # overhead + weights / disk bandwidth
    recommended_s: int  # the renderer's startup budget (with its safety factor)
    weights_gib: float | None  # None: the model was not found locally
    note: str


def is_manifest_path(path: Path) -> bool:
    """A directory, or a file whose YAML/JSON documents look like Kubernetes objects."""
    if path.is_dir():
        return True
    try:
        docs = list(yaml.safe_load_all(path.read_text()))
    except (OSError, yaml.YAMLError):
        return False
    return any(isinstance(d, dict) and "apiVersion" in d and "kind" in d for d in docs)


def manifest_files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.suffix in MANIFEST_SUFFIXES
                      and p.is_file())
    return [path]


def _docs(path: Path) -> Iterator[dict[str, Any]]:
    try:
        loaded = list(yaml.safe_load_all(path.read_text()))
    except yaml.YAMLError as exc:
        raise InferplaneError(f"not YAML: {exc}", field="manifest", value=str(path),
                              fix="give Kubernetes manifests (YAML or JSON)") from exc
    for doc in loaded:
        if isinstance(doc, dict) and doc.get("kind") == "List":
            yield from (d for d in doc.get("items") or [] if isinstance(d, dict))
        elif isinstance(doc, dict):
            yield doc


def _pod_specs(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    kind = str(doc.get("kind"))
    name = f"{kind}/{(doc.get('metadata') or {}).get('name', '?')}"
    spec = doc.get("spec") or {}
    if kind == "Pod":
        yield name, spec
    elif kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        yield name, (spec.get("template") or {}).get("spec") or {}
    elif kind == "CronJob":
        job = (spec.get("jobTemplate") or {}).get("spec") or {}
        yield name, (job.get("template") or {}).get("spec") or {}
    elif kind == "LeaderWorkerSet":
        lwt = spec.get("leaderWorkerTemplate") or {}
        for role in ("leaderTemplate", "workerTemplate"):
            if lwt.get(role):
                yield f"{name} ({role.removesuffix('Template')})", lwt[role].get("spec") or {}


def _words(container: dict[str, Any]) -> list[str]:
    """command + args as argv words; a shell string (`sh -c "vllm serve ..."`) is split."""
    out: list[str] = []
    for item in [*(container.get("command") or []), *(container.get("args") or [])]:
        text = str(item)
        if " " in text.strip():
            try:
                out.extend(shlex.split(text))
            except ValueError:
                out.extend(text.split())
        else:
            out.append(text)
    return out


def _vllm_args(words: list[str]) -> tuple[str, ...] | None:
    """The words after `vllm serve` / the API server module, or None if this is not vLLM."""
    for i, word in enumerate(words):
        if Path(word).name == "vllm" and i + 1 < len(words) and words[i + 1] == "serve":
            return tuple(words[i + 2:])
        if word in ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server"):
            return tuple(words[i + 1:])
    return None


def _model_of(args: tuple[str, ...]) -> str | None:
    for i, word in enumerate(args):
        if word == "--model" and i + 1 < len(args):
            return _plain(args[i + 1])
        if word.startswith("--model="):
            return _plain(word.split("=", 1)[1])
    if args and not args[0].startswith("-"):
        return _plain(args[0])
    return None


def _plain(value: str) -> str | None:
    return None if "$" in value else value  # $(MODEL), ${MODEL}: set elsewhere


def _image_entrypoint_args(container: dict[str, Any]) -> tuple[str, ...] | None:
    """`args:` of a vllm/vllm-openai container that keeps the image's entrypoint."""
    if container.get("command") or not _API_SERVER_IMAGE.search(str(container.get("image"))):
        return None
    return tuple(_words({"args": container.get("args") or []}))


def find_engines(paths: list[Path]) -> list[EngineContainer]:
    found: list[EngineContainer] = []
    for path in paths:
        for doc in _docs(path):
            for workload, pod in _pod_specs(doc):
                for c in [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]:
                    args = _vllm_args(_words(c))
                    if args is None:
                        args = _image_entrypoint_args(c)
                    if args is not None:
                        found.append(EngineContainer(str(path), workload, str(c.get("name")),
                                                     _model_of(args), args, c))
    return found


def _flag(args: tuple[str, ...], name: str) -> str | None:
    for i, word in enumerate(args):
        if word == name and i + 1 < len(args):
            return args[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


def _model_dir(model: str, models_root: Path | None) -> Path | None:
    from inferplane.doctor.diagnose import find_model_dir

    if models_root is not None:
        for candidate in (models_root / model.strip("/").replace("/", "--"),
                          models_root / Path(model).name, models_root / model.strip("/")):
            if (candidate / "config.json").is_file():
                return candidate
    return find_model_dir(model)


def _profile(engine: EngineContainer, models_root: Path | None) -> Any:
    """The model's profile when its config.json is local, else None."""
    from inferplane.models import load_profile

    if engine.model is None:
        return None
    directory = _model_dir(engine.model, models_root)
    if directory is None:
        return None
    try:
        return load_profile(directory)
    except InferplaneError:
        return None


def utilization_advice(engine: EngineContainer, models_root: Path | None) -> list[Advice]:
    """P06: --gpu-memory-utilization above the safe band (per model when it is local)."""
    raw = _flag(engine.args, "--gpu-memory-utilization")
    if raw is None:
        return []
    try:
        value = float(raw)
    except ValueError:
        return []  # $(UTIL) and the like: set elsewhere
    band, basis = UTILIZATION_BAND, "BF16/FP16 models"
    profile = _profile(engine, models_root)
    if profile is not None:
        from inferplane.estimator.types import EngineSettings
        from inferplane.planner.sizing import safe_band

        settings = EngineSettings(dtype=_flag(engine.args, "--dtype") or "auto",
                                  quantization=_flag(engine.args, "--quantization"))
        band, basis = safe_band(profile, settings), f"{profile.name}"
    if value <= band:
        return []
    return [Advice(None, "P06", "warn", engine.where("--gpu-memory-utilization"), value,
                   f"above the safe band for {basis} (<= {band:.2f}): activations and "
                   "fragmentation under load can still OOM (the sampler warm-up of "
                   "max_num_seqs requests also runs outside the budget)",
                   f"--gpu-memory-utilization {band:.2f}")]


def weights_bytes(engine: EngineContainer, models_root: Path | None) -> int | None:
    """The model's weights by the estimator (its --dtype / --quantization), or None."""
    from inferplane.estimator.weights import (
        resolve_dtype,
        resolve_quantization,
        weight_bytes,
        weight_format,
    )
    from inferplane.models import load_profile

    if engine.model is None:
        return None
    directory = _model_dir(engine.model, models_root)
    if directory is None:
        return None
    try:
        profile = load_profile(directory)
        dtype = resolve_dtype(profile, _flag(engine.args, "--dtype") or "auto")
        quant = resolve_quantization(profile, _flag(engine.args, "--quantization"))
        return weight_bytes(profile, weight_format(profile, dtype, quant), 1).total_bytes
    except InferplaneError:
        return None


def load_time(weights: int | None, options: RenderOptions) -> LoadTime:
    """Expected and recommended load time, reusing the renderer's startup budget."""
    known = weights if weights is not None else 0
    bare = replace(options, startup_safety=1.0, startup_min_s=1, probe_period_s=1)
    expected = bare.startup_budget_s(known)
    recommended = options.startup_budget_s(known)
    if weights is None:
        note = (f"weights not counted (model not found locally): {options.startup_overhead_s:g} s "
                "of CUDA init, compile and graph capture is a lower bound")
        return LoadTime(expected, recommended, None, note)
    gib = weights / 2**30
    note = (f"{gib:.1f} GiB of weights at {options.disk_read_mib_s:g} MiB/s + "
            f"{options.startup_overhead_s:g} s of CUDA init, compile and graph capture")
    return LoadTime(expected, recommended, gib, note)


def _budget(probe: dict[str, Any]) -> tuple[int, int, int, int]:
    delay = int(probe.get("initialDelaySeconds", K8S_DEFAULTS["initialDelaySeconds"]))
    period = int(probe.get("periodSeconds", K8S_DEFAULTS["periodSeconds"]))
    failures = int(probe.get("failureThreshold", K8S_DEFAULTS["failureThreshold"]))
    return delay + failures * period, delay, period, failures


def _port(c: dict[str, Any], args: tuple[str, ...]) -> str:
    ports = c.get("ports") or []
    if ports and ports[0].get("name"):
        return str(ports[0]["name"])
    if ports and ports[0].get("containerPort"):
        return str(ports[0]["containerPort"])
    return _flag(args, "--port") or "8000"


def probe_advice(engine: EngineContainer, lt: LoadTime) -> list[Advice]:
    c, out = engine.spec, []
    port = _port(c, engine.args)
    label = engine.model or "the model"
    startup, liveness = c.get("startupProbe"), c.get("livenessProbe")
    if startup:
        budget, delay, period, failures = _budget(startup)
        need = max(1, math.ceil((lt.recommended_s - delay) / period))
        fix = (f"startupProbe.failureThreshold: {need} (x periodSeconds {period} "
               f"+ initialDelaySeconds {delay} = {delay + need * period} s)")
        if budget < lt.expected_s:
            out.append(Advice(None, "P24", "warn", engine.where("startupProbe"),
                              f"{failures} x {period} s + {delay} s",
                              f"the startup probe gives {label} {budget} s, loading takes "
                              f"~{lt.expected_s} s ({lt.note}): the container is killed "
                              "while it loads, then CrashLoopBackOff", fix))
        elif budget < lt.recommended_s:
            out.append(Advice(None, "P24", "info", engine.where("startupProbe"),
                              f"{failures} x {period} s + {delay} s",
                              f"the startup probe gives {label} {budget} s, loading takes "
                              f"~{lt.expected_s} s ({lt.note}): less than the "
                              f"{lt.recommended_s} s a slower disk or a busy node needs", fix))
    elif liveness:
        budget, delay, period, failures = _budget(liveness)
        need = math.ceil(lt.recommended_s / 10)
        fix = (f"add startupProbe: {{httpGet: {{path: /health, port: {port}}}, "
               f"periodSeconds: 10, failureThreshold: {need}}} ({need * 10} s); the liveness "
               "probe then starts only after it succeeds")
        severity = "warn" if budget < lt.expected_s else "info"
        message = (f"a liveness probe without a startup probe runs while {label} loads: it "
                   f"kills the container after {budget} s, loading takes ~{lt.expected_s} s "
                   f"({lt.note})" if severity == "warn" else
                   f"a liveness probe without a startup probe: its {delay} s initial delay "
                   f"covers the ~{lt.expected_s} s load ({lt.note}) but also delays "
                   "detecting a hung engine after every restart")
        out.append(Advice(None, "P24", severity, engine.where("livenessProbe"),
                          f"{failures} x {period} s + {delay} s", message, fix))
    if not c.get("readinessProbe"):
        out.append(Advice(None, "P24", "info", engine.where("readinessProbe"), None,
                          "no readiness probe: the Service sends requests to the pod while "
                          f"{label} is still loading (connection refused, 502)",
                          f"add readinessProbe: {{httpGet: {{path: /health, port: {port}}}, "
                          "periodSeconds: 5, failureThreshold: 3}"))
    return out


def lint_manifests(path: Path, *, models_root: Path | None = None,
                   options: RenderOptions | None = None) -> list[Advice]:
    """Probe advice for every vLLM container in the manifests at `path` (file or dir);
    an InferplaneError when none runs vLLM (nothing was checked)."""
    opts = options or RenderOptions()
    files = manifest_files(path)
    engines = find_engines(files)
    if not engines:
        # "no advice" would read as "the probes are fine" when nothing was checked.
        looked = (f"{len(files)} manifest file(s) (.yaml, .yml, .json) under it" if path.is_dir()
                  else "its documents")
        raise InferplaneError(
            f"no container runs `vllm serve`, vLLM's API server module or a "
            f"vllm/vllm-openai image's entrypoint in {looked}",
            field="manifests", value=str(path),
            fix="point lint at the manifests of your vLLM workloads (Pod, Deployment, "
                "StatefulSet, DaemonSet, ReplicaSet, Job, CronJob, LeaderWorkerSet), or at "
                "one fleet file")  # fmt: skip
    out: list[Advice] = []
    for engine in engines:
        out.extend(probe_advice(engine, load_time(weights_bytes(engine, models_root), opts)))
        out.extend(utilization_advice(engine, models_root))
    return out
