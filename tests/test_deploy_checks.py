"""`render --check`: every semantic check and the schema round trips catch a broken file."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from deploy_plans import s0, s4

from inferplane.deploy import RenderOptions, render_files
from inferplane.deploy.checks import Doc, schema_problems, semantic_problems


def _docs(scenario: Callable[[], Any]) -> list[Doc]:
    fleet, plan, text = scenario()
    files = render_files(fleet, plan, "k8s", RenderOptions(fleet_text=text))
    return [(path, d) for path, body in sorted(files.items())
            for d in yaml.safe_load_all(body) if d and d["kind"] != "Kustomization"]


def _find(docs: list[Doc], kind: str, name: str) -> dict[str, Any]:
    return next(d for _, d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def _container(dep: dict[str, Any], i: int = 0) -> dict[str, Any]:
    container: dict[str, Any] = dep["spec"]["template"]["spec"]["containers"][i]
    return container


COLO = "qwen3-embedding-0-6b-qwen3-32b-fp8"


def _gpu_mismatch(docs: list[Doc]) -> None:
    _container(_find(docs, "Deployment", "qwen3-32b"))["resources"]["limits"][
        "nvidia.com/gpu"] = "1"


def _second_gpu(docs: list[Doc]) -> None:
    c = _container(_find(docs, "Deployment", COLO), 1)
    c["resources"]["requests"]["nvidia.com/gpu"] = "1"
    c["resources"]["limits"] = {"nvidia.com/gpu": "1"}


def _selector(docs: list[Doc]) -> None:
    _find(docs, "Deployment", "qwen3-8b")["spec"]["selector"]["matchLabels"][
        "inferplane.io/workload"] = "other"


def _port_name(docs: list[Doc]) -> None:
    _container(_find(docs, "Deployment", "qwen3-8b"))["ports"][0]["name"] = "a-very-long-port-name"


def _surge(docs: list[Doc]) -> None:
    _find(docs, "Deployment", "qwen3-8b")["spec"]["strategy"]["rollingUpdate"]["maxSurge"] = 1


def _grace(docs: list[Doc]) -> None:
    _find(docs, "Deployment", "qwen3-8b")["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"] = 30


def _quantity(docs: list[Doc]) -> None:
    _container(_find(docs, "Deployment", "qwen3-8b"))["resources"]["requests"]["memory"] = "18GB!"


def _scale_target(docs: list[Doc]) -> None:
    _find(docs, "ScaledObject", "qwen3-8b")["spec"]["scaleTargetRef"]["name"] = "gone"


def _service_port(docs: list[Doc]) -> None:
    _find(docs, "Service", "qwen3-8b")["spec"]["ports"][0]["targetPort"] = "nope"


def _two_pdbs(docs: list[Doc]) -> None:
    extra = copy.deepcopy(_find(docs, "PodDisruptionBudget", "qwen3-8b"))
    extra["metadata"]["name"] = "qwen3-8b-extra"
    docs.append(("extra.yaml", extra))


def _name(docs: list[Doc]) -> None:
    _find(docs, "Service", "qwen3-8b")["metadata"]["name"] = "Qwen3_8B"


def _no_startup(docs: list[Doc]) -> None:
    del _container(_find(docs, "Deployment", "qwen3-8b"))["startupProbe"]


@pytest.mark.parametrize(("mutate", "needle"), [
    (_gpu_mismatch, "requests 2 != limits 1"),
    (_second_gpu, "containers request GPUs"),
    (_selector, "matchLabels do not match"),
    (_port_name, "IANA service name"),
    (_surge, "maxSurge: 0"),
    (_grace, "terminationGracePeriodSeconds 30"),
    (_quantity, "not a Kubernetes quantity"),
    (_scale_target, "scale target Deployment/gone does not exist"),
    (_service_port, "targetPort 'nope'"),
    (_two_pdbs, "2 PodDisruptionBudgets"),
    (_name, "not a valid Service name"),
    (_no_startup, "without a startup probe"),
])
def test_semantic_checks_catch(mutate: Callable[[list[Doc]], None], needle: str) -> None:
    docs = _docs(s4) + [d for d in _docs(s0) if d[1]["kind"] == "Deployment"
                        and d[1]["metadata"]["name"] == COLO]
    assert semantic_problems(docs) == []
    mutate(docs)
    messages = [p.render() for p in semantic_problems(docs)]
    assert any(needle in m for m in messages), messages


def test_strict_schema_rejects_unknown_field() -> None:
    docs = _docs(s4)
    dep = _find(docs, "Deployment", "qwen3-8b")
    _container(dep)["startupprobe"] = {"periodSeconds": 10}  # wrong case: kubectl ignores it
    problems = schema_problems([d for d in docs if d[1] is dep], ("1.29", "1.33"))
    assert len(problems) == 2 and all("startupprobe" in p.message for p in problems)


def test_crd_round_trip_catches_unknown_field() -> None:
    docs = _docs(s4)
    so = _find(docs, "ScaledObject", "qwen3-8b")
    pm = _find(docs, "PodMonitor", "qwen3-8b")
    assert schema_problems([("a", so), ("b", pm)], ("1.33",)) == []
    so["spec"]["minReplicas"] = 1  # an HPA spelling; KEDA wants minReplicaCount
    pm["spec"]["podMetricsEndpoint"] = []
    problems = schema_problems([("a", so), ("b", pm)], ("1.33",))
    assert {p.obj for p in problems} == {"ScaledObject/qwen3-8b", "PodMonitor/qwen3-8b"}
    assert any("minReplicas" in p.message for p in problems)
