"""Gateway API Inference Extension: an InferencePool per model, validated against GIE's own
CRD (vendored under tests/data/gie with its source), and the endpoint picker it names."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from crd_schema import json_schema
from deploy_plans import s0, s4

from inferplane.deploy import RenderOptions, render, render_files, render_warnings
from inferplane.deploy.checks import check_k8s_dir
from inferplane.deploy.names import object_name
from inferplane.errors import InferplaneError

DATA = Path(__file__).parent / "data" / "gie"
CRD = yaml.safe_load((DATA / "inference.networking.k8s.io_inferencepools.yaml").read_text())
VENDORED = Path(__file__).parents[1] / "inferplane/deploy/schemas/inferencepool-v1.json"
SOURCE = ("kubernetes-sigs/gateway-api-inference-extension config/crd/bases/"
          "inference.networking.k8s.io_inferencepools.yaml at "
          "84436a96b9e6ce2b59ddacd3d04c31b4fbd442de, Apache-2.0")
EPP = "registry.example.com/epp:v1"


def _docs(scenario: Any, **opts: Any) -> dict[str, list[dict[str, Any]]]:
    fleet, plan, text = scenario()
    files = render_files(fleet, plan, "k8s", RenderOptions(fleet_text=text, **opts))
    return {p: [d for d in yaml.safe_load_all(t) if d] for p, t in files.items()}


def _all(docs: dict[str, list[dict[str, Any]]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for objs in docs.values() for d in objs if d["kind"] == kind}


def test_the_vendored_check_schema_is_the_crds() -> None:
    want = json_schema(CRD, "v1", SOURCE)
    if os.environ.get("INFERPLANE_UPDATE_SCHEMAS"):
        VENDORED.write_text(json.dumps(want, indent=2, sort_keys=True) + "\n")
    assert json.loads(VENDORED.read_text()) == want


def test_one_pool_per_model_valid_against_the_crd_and_render_check(tmp_path: Path) -> None:
    (served,) = CRD["spec"]["versions"]
    assert (CRD["spec"]["group"], served["name"]) == ("inference.networking.k8s.io", "v1")
    crd_schema = served["schema"]["openAPIV3Schema"]
    for scenario in (s0, s4):
        docs = _docs(scenario, inference_pool=True, epp_image=EPP)
        pools = _all(docs, "InferencePool")
        services = _all(docs, "Service")
        deployments = _all(docs, "Deployment")
        fleet, plan, text = scenario()
        models = {object_name(m): m for m in {i.model for i in plan.instances}}
        split = {m for m in models.values()  # S0's embedding model: a port per pod
                 if len({i.port for i in plan.instances_of(m)}) > 1}
        assert sorted(pools) == sorted(n for n, m in models.items() if m not in split)
        warned = render_warnings(fleet, plan, "k8s", RenderOptions(
            fleet_text=text, inference_pool=True, epp_image=EPP))
        assert sorted(w.split("]")[0][7:] for w in warned if "no InferencePool" in w) == sorted(
            split)
        for name, pool in pools.items():
            jsonschema.validate(pool, crd_schema)  # the CRD's own OpenAPI schema
            spec = pool["spec"]
            # The pods of the model's Service, on the port its engines listen on.
            assert spec["selector"]["matchLabels"] == services[name]["spec"]["selector"]
            (port,) = spec["targetPorts"]
            assert {port["number"]} == {i.port for i in plan.instances_of(models[name])}
            ref = spec["endpointPickerRef"]
            assert ref["port"] == {"number": 9002} and ref["failureMode"] == "FailClose"
            epp_svc, epp = services[ref["name"]], deployments[ref["name"]]
            labels = epp["spec"]["template"]["metadata"]["labels"]
            assert all(labels[k] == v for k, v in epp_svc["spec"]["selector"].items())
            args = epp["spec"]["template"]["spec"]["containers"][0]["args"]
            assert args[args.index("--pool-name") + 1] == name
            assert args[args.index("--pool-namespace") + 1] == "$(POD_NAMESPACE)"
            (env,) = epp["spec"]["template"]["spec"]["containers"][0]["env"]
            assert env["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
            assert epp_svc["spec"]["ports"][0]["appProtocol"] == "http2"
        sa, role, binding = docs["epp/rbac.yaml"]
        assert binding["subjects"][0]["name"] == sa["metadata"]["name"] == (
            deployments[ref["name"]]["spec"]["template"]["spec"]["serviceAccountName"])
        assert {"apiGroups": ["inference.networking.k8s.io"], "resources": ["inferencepools"],
                "verbs": ["get", "list", "watch"]} in role["rules"]
        out = tmp_path / scenario.__name__
        render(fleet, plan, "k8s", out,
               options=RenderOptions(fleet_text=text, inference_pool=True, epp_image=EPP))
        assert check_k8s_dir(out) == []  # strict schemas (pools: the CRD's) + semantics


def test_pools_are_opt_in_and_a_missing_picker_is_a_warning() -> None:
    assert not _all(_docs(s4), "InferencePool")  # needs GIE's CRDs: never by default
    docs = _docs(s4, inference_pool=True)
    assert _all(docs, "InferencePool")
    assert "epp/rbac.yaml" not in docs and not any("epp" in p for p in docs)
    fleet, plan, text = s4()
    got = render_warnings(fleet, plan, "k8s", RenderOptions(fleet_text=text,
                                                            inference_pool=True))
    assert any("without --epp-image" in w for w in got)
    with pytest.raises(InferplaneError, match="add --inference-pool"):
        RenderOptions(epp_image=EPP)


def test_render_check_catches_what_the_crd_forbids(tmp_path: Path) -> None:
    fleet, plan, text = s4()
    render(fleet, plan, "k8s", tmp_path,
           options=RenderOptions(fleet_text=text, inference_pool=True))
    (path,) = [p for p in tmp_path.rglob("inferencepool.yaml") if "qwen3-8b" in str(p)]
    header, body = path.read_text().split("\n", 1)
    pool = yaml.safe_load(body)
    good = pool["spec"]["targetPorts"][0]["number"]
    cases = {
        "unknown or mistyped": {"targetPortNumber": 8000},  # the v1alpha2 field name
        "port number must be unique": {"targetPorts": [{"number": good}, {"number": good}]},
        "is not a container port": {"targetPorts": [{"number": 1}]},
        "port is required": {"endpointPickerRef": {"name": "x"}},
        "selector matches no pod": {"selector": {"matchLabels": {"app": "nothing"}}},
    }
    for needle, change in cases.items():
        broken = {**pool, "spec": {**pool["spec"], **change}}
        path.write_text(header + "\n" + yaml.safe_dump(broken))
        problems = [p.render() for p in check_k8s_dir(tmp_path)]
        assert problems, needle
        if needle == "unknown or mistyped":
            assert any("targetPortNumber" in p for p in problems), problems
        else:
            assert any(needle in p for p in problems), (needle, problems)
