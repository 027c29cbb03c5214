"""Kubernetes rendering: the hard-won settings (P05, P14, P18–P20, P24, P26, P27, P30, P46–P50)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_plans import KUBECTL, s0, s4

from inferplane.deploy import RenderOptions, render, render_files
from inferplane.deploy.checks import check_k8s_dir
from inferplane.deploy.k8s.context import K8sContext
from inferplane.deploy.k8s.engine import HANDOFF_FILE, launcher_script
from inferplane.errors import InferplaneError


def _docs(files: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    return {path: [d for d in yaml.safe_load_all(text) if d] for path, text in files.items()}


def _k8s(scenario: Any, **opts: Any) -> dict[str, list[dict[str, Any]]]:
    fleet, plan, text = scenario()
    return _docs(render_files(fleet, plan, "k8s", RenderOptions(fleet_text=text, **opts)))


def _deployments(docs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for objs in docs.values() for d in objs
            if d["kind"] == "Deployment"}


def _containers(dep: dict[str, Any]) -> list[dict[str, Any]]:
    containers: list[dict[str, Any]] = dep["spec"]["template"]["spec"]["containers"]
    return containers


def test_render_is_byte_identical_and_valid(tmp_path: Path) -> None:
    for scenario in (s0, s4):
        fleet, plan, text = scenario()
        a, b = tmp_path / f"{scenario.__name__}-a", tmp_path / f"{scenario.__name__}-b"
        opts = RenderOptions(fleet_text=text, ingress_host="llm.example.com")
        written = render(fleet, plan, "k8s", a, options=opts)
        render(fleet, plan, "k8s", b, options=opts)
        assert written
        for path in written:
            assert path.read_bytes() == (b / path.relative_to(a)).read_bytes()
        assert not list(a.rglob(".*"))  # no temp files left behind
        assert check_k8s_dir(a) == []


def test_s0_colocated_pod_requests_one_gpu_and_hands_off_the_uuid() -> None:
    deps = _deployments(_k8s(s0))
    colocated = [d for d in deps.values() if len(_containers(d)) == 2]
    assert len(colocated) == 3  # one pod per L40S (S0)
    for dep in colocated:
        first, second = _containers(dep)
        assert first["resources"]["limits"] == {"nvidia.com/gpu": "1"}
        assert first["resources"]["requests"]["nvidia.com/gpu"] == "1"
        assert "limits" not in second["resources"]  # P18: the second asks for no GPU
        assert "nvidia.com/gpu" not in second["resources"]["requests"]
        env2 = {e["name"]: e["value"] for e in second["env"]}
        assert env2["NVIDIA_VISIBLE_DEVICES"] == "all"
        assert env2["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert "CUDA_VISIBLE_DEVICES" not in env2  # set at start from the UUID (P19, P20)
        assert all(e["name"] != "CUDA_VISIBLE_DEVICES" for e in first["env"])
        assert f"> {HANDOFF_FILE}.tmp" in first["command"][2]
        assert f"for uuid in $(cat {HANDOFF_FILE})" in second["command"][2]
        mounts = {m["name"] for c in (first, second) for m in c["volumeMounts"]}
        assert "gpu-handoff" in mounts
        # The second waits for the first: its startup budget includes the first's (S0 P24).
        assert (second["startupProbe"]["failureThreshold"]
                > first["startupProbe"]["failureThreshold"])
        assert dep["spec"]["template"]["spec"]["nodeSelector"] == {
            "nvidia.com/gpu.product": "NVIDIA-L40S"}  # the fleet's node labels (P14)


def test_secondary_launcher_maps_uuid_to_index(tmp_path: Path) -> None:
    fleet, plan, text = s0()
    ctx = K8sContext(fleet, plan, RenderOptions(fleet_text=text))
    inst = plan.instance("qwen3-32b-fp8-0")
    handoff = tmp_path / "uuids"
    handoff.write_text("GPU-bbbb\n")
    script = launcher_script(ctx, inst, "secondary", []).replace(HANDOFF_FILE, str(handoff))
    fake = tmp_path / "bin"
    fake.mkdir()
    smi = fake / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf '0, GPU-aaaa\\n1, GPU-bbbb\\n2, GPU-cccc\\n'\n")
    smi.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    result = subprocess.run(
        ["/bin/sh", "-c", script, "launch", "sh", "-c", 'echo "cvd=$CUDA_VISIBLE_DEVICES"'],
        capture_output=True, text=True, env=env, timeout=30, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "cvd=1" in result.stdout
    handoff.write_text("GPU-zzzz\n")
    bad = subprocess.run(["/bin/sh", "-c", script, "launch", "true"], capture_output=True,
                         text=True, env=env, timeout=30, check=False)
    assert bad.returncode == 1 and "GPU-zzzz is not visible" in bad.stderr


def test_json_argument_survives_yaml_unchanged() -> None:  # P05
    deps = _deployments(_k8s(s0))
    args = [a for d in deps.values() for c in _containers(d) for a in c["args"]]
    config = args[args.index("--compilation-config") + 1]
    assert json.loads(config) == {"cudagraph_capture_sizes": [1, 2, 4, 8]}


def test_probes_drain_rollout_shm_nofile() -> None:
    opts = RenderOptions()
    deps = _deployments(_k8s(s4))
    r1 = deps["deepseek-r1"]
    spec = r1["spec"]
    assert spec["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}  # P26
    (c,) = _containers(r1)
    startup = c["startupProbe"]
    assert startup["httpGet"]["path"] == "/v1/models"
    assert c["readinessProbe"]["httpGet"]["path"] == "/v1/models"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    # 642 GiB at 200 MiB/s plus overhead: well over an hour of budget (P24).
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 642 * 1024 / 200
    pod = spec["template"]["spec"]
    grace = pod["terminationGracePeriodSeconds"]
    shutdown = int(c["args"][c["args"].index("--shutdown-timeout") + 1])
    prestop = int(c["lifecycle"]["preStop"]["exec"]["command"][1])
    assert grace > shutdown + prestop  # P27
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
    assert f"ulimit -n {opts.nofile}" in c["command"][2]  # P30
    assert c["args"][c["args"].index("--host") + 1] == "0.0.0.0"
    assert pod["nodeSelector"] == {"inferplane.io/gpu-type": "H200"}
    assert pod["enableServiceLinks"] is False


def test_startup_budget_matches_s0() -> None:
    # S0: the ~34 GB 35B MoE needed ~600 s before liveness could start.
    budget = RenderOptions().startup_budget_s(34 * 10**9)
    assert 540 <= budget <= 660
    assert RenderOptions(startup_overhead_s=10).startup_budget_s(1) == 300  # the floor


def test_keda_scaledobject_and_unscaled_replicas() -> None:
    docs = _k8s(s4)
    (so,) = docs["models/qwen3-8b/scaledobject.yaml"]
    spec = so["spec"]
    assert spec["scaleTargetRef"]["name"] == "qwen3-8b"
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 4)  # P28 floor
    waiting = spec["triggers"][0]["metadata"]
    assert "vllm:num_requests_waiting" in waiting["query"]  # P46
    assert waiting["threshold"] == "5"
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 600  # P50, max(600, 300)
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 120
    assert spec["triggers"][1]["metadata"]["threshold"] == "0.9"
    deps = _deployments(docs)
    assert "replicas" not in deps["qwen3-8b"]["spec"]  # KEDA owns it
    assert deps["qwen3-32b"]["spec"]["replicas"] == 1
    assert not any(p.endswith("scaledobject.yaml") for p in docs if "qwen3-8b" not in p)


def test_hpa_alternative_validates(tmp_path: Path) -> None:
    fleet, plan, text = s4()
    render(fleet, plan, "k8s", tmp_path, options=RenderOptions(fleet_text=text,
                                                               autoscaler="hpa"))
    hpa = yaml.safe_load((tmp_path / "models/qwen3-8b/hpa.yaml").read_text())
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "vllm_num_requests_waiting"
    assert (tmp_path / "monitoring/prometheus-adapter-rules.yaml").is_file()
    assert check_k8s_dir(tmp_path) == []


def test_alerts_use_s2_thresholds() -> None:  # P49
    (rule,) = _k8s(s4)["monitoring/prometheusrule.yaml"]
    exprs = {(r["alert"], r["labels"].get("model")): r["expr"]
             for g in rule["spec"]["groups"] for r in g["rules"]}
    assert exprs[("InferplaneEngineNearMaxNumSeqs", "qwen3-8b")].endswith("> 102.4")
    assert exprs[("InferplaneEngineQueueBacklog", "qwen3-8b")].endswith("> 20")
    assert exprs[("InferplaneKvCacheFull", "deepseek-r1")].endswith("> 0.95")
    assert "offset 1d" in exprs[("InferplaneThroughputDropped", "qwen3-32b")]


def test_dashboard_shows_kv_usage_and_queue_vs_engine() -> None:  # P47, P48
    (cm,) = _k8s(s4)["monitoring/dashboard.yaml"]
    board = json.loads(cm["data"]["inferplane.json"])
    exprs = " ".join(t["expr"] for p in board["panels"] for t in p["targets"])
    assert "vllm:kv_cache_usage_perc" in exprs
    assert "inferplane_queue_wait_seconds_bucket" in exprs
    assert "inferplane_upstream_ttft_seconds_bucket" in exprs
    assert "gpu_memory" not in exprs.lower() and "DCGM" not in exprs


def test_gateway_objects_and_ingress_limits() -> None:  # P40, P41
    docs = _k8s(s0, ingress_host="llm.example.com")
    (dep,) = docs["gateway/deployment.yaml"]
    assert dep["spec"]["replicas"] >= 2
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    # Pods are discovered (issue 24): no Service URL, which would be one replica per model.
    # The pod's own namespace (downward API), where its Role is: see the overlay test.
    assert args[-4:] == ["--discover", "kubernetes", "--namespace", "$(POD_NAMESPACE)"]
    (env,) = dep["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env == {"name": "POD_NAMESPACE",
                   "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}
    assert "--backend" not in args
    assert not [a for a in args if "://" in a or ".svc" in a], args
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "inferplane-gateway"
    sa, role, binding = docs["gateway/rbac.yaml"]
    assert (sa["kind"], role["kind"], binding["kind"]) == (
        "ServiceAccount", "Role", "RoleBinding")
    assert {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
            "verbs": ["get", "list", "watch"]} in role["rules"]
    assert {"apiGroups": [""], "resources": ["pods"],
            "verbs": ["get", "list", "watch"]} in role["rules"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": "inferplane"}]
    (ing,) = docs["gateway/ingress.yaml"]
    notes = ing["metadata"]["annotations"]
    assert notes["nginx.ingress.kubernetes.io/proxy-body-size"] == "32m"
    assert int(notes["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= 600
    cm, _ = docs["gateway/configmap.yaml"]
    assert "qwen3-embedding-0.6b" in cm["data"]["fleet.yaml"]


def test_the_plan_is_a_configmap_the_gateway_reads() -> None:
    from inferplane.planner.plan import Plan

    fleet, plan, text = s0()
    docs = _docs(render_files(fleet, plan, "k8s", RenderOptions(fleet_text=text)))
    _, plan_cm = docs["gateway/configmap.yaml"]
    assert plan_cm["metadata"]["name"] == "inferplane-plan"
    assert Plan.model_validate_json(plan_cm["data"]["plan.json"]) == plan  # the whole plan
    (dep,) = docs["gateway/deployment.yaml"]
    pod = dep["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args[args.index("--plan") + 1] == "/etc/inferplane/plan.json"
    assert args[args.index("--fleet") + 1] == "/etc/inferplane/fleet.yaml"
    (volume,) = pod["volumes"]
    assert [s["configMap"]["name"] for s in volume["projected"]["sources"]] == [
        "inferplane-fleet", "inferplane-plan"]
    # A changed plan rolls the gateways (they read it at start).
    notes = dep["spec"]["template"]["metadata"]["annotations"]
    bigger = plan.model_copy(update={"instances": [
        i.model_copy(update={"max_num_seqs": i.max_num_seqs + 1}) for i in plan.instances]})
    docs2 = _docs(render_files(fleet, bigger, "k8s", RenderOptions(fleet_text=text)))
    (dep2,) = docs2["gateway/deployment.yaml"]
    notes2 = dep2["spec"]["template"]["metadata"]["annotations"]
    assert notes2["inferplane.io/plan-sha256"] != notes["inferplane.io/plan-sha256"]
    assert notes2["inferplane.io/fleet-sha256"] == notes["inferplane.io/fleet-sha256"]
    # Each engine pod names its plan instances: what the gateway matches pods by.
    for objs in docs.values():
        for d in objs:
            if d["kind"] == "Deployment" and d["metadata"]["name"] != "inferplane-gateway":
                ids = d["spec"]["template"]["metadata"]["annotations"]["inferplane.io/instances"]
                assert all(plan.instance(i) for i in ids.split(","))


def test_one_pdb_per_pod_and_services_by_model() -> None:
    docs = _k8s(s0)
    pdbs = [d for objs in docs.values() for d in objs if d["kind"] == "PodDisruptionBudget"]
    assert len(pdbs) == 4  # three pods + gateway; never one per model
    (svc,) = docs["models/qwen3-embedding-0-6b/service.yaml"]
    assert svc["spec"]["selector"] == {"model.inferplane.io/qwen3-embedding-0.6b": "true"}


def test_namespace_and_version_errors(tmp_path: Path) -> None:
    fleet, plan, text = s0()
    render(fleet, plan, "k8s", tmp_path, namespace="llm", options=RenderOptions(fleet_text=text))
    kust = yaml.safe_load((tmp_path / "kustomization.yaml").read_text())
    assert kust["namespace"] == "llm"
    with pytest.raises(InferplaneError, match="namespace"):
        RenderOptions(namespace="Bad_NS")
    with pytest.raises(InferplaneError, match="too old"):
        RenderOptions(k8s_version="1.22")
    with pytest.raises(InferplaneError, match="unknown render target"):
        render_files(fleet, plan, "helm", RenderOptions(fleet_text=text))


@pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed")
def test_kubectl_kustomize_builds(tmp_path: Path) -> None:
    fleet, plan, text = s4()
    render(fleet, plan, "k8s", tmp_path, options=RenderOptions(fleet_text=text))
    result = subprocess.run([str(KUBECTL), "kustomize", str(tmp_path)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(result.stdout) if d]
    assert kinds.count("Deployment") == 4 and "ScaledObject" in kinds


@pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed")
def test_an_overlay_that_moves_the_namespace_moves_what_the_gateway_watches(
    tmp_path: Path,
) -> None:
    # kustomize's `namespace:` moves every object and the RoleBinding's subject, but not
    # a namespace written into args: the gateway would watch where its Role grants nothing
    # (403, never ready). The kubelet's expansion of the downward API follows the pod.
    fleet, plan, text = s0()
    render(fleet, plan, "k8s", tmp_path / "base",
           options=RenderOptions(fleet_text=text, inference_pool=True, epp_image="epp:1"))
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "namespace: llm-prod\nresources:\n- base\n")
    result = subprocess.run([str(KUBECTL), "kustomize", str(tmp_path)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    roles = [d for d in docs if d["kind"] in ("Role", "RoleBinding")]
    assert {d["metadata"]["namespace"] for d in roles} == {"llm-prod"}
    watchers = [d for d in docs if d["kind"] == "Deployment"
                and d["metadata"]["name"] in ("inferplane-gateway", "qwen3-30b-a3b-epp")]
    assert len(watchers) == 2
    for dep in watchers:
        (c,) = dep["spec"]["template"]["spec"]["containers"]
        assert "inferplane" not in c["args"], c["args"]  # no namespace of the render's
        assert "$(POD_NAMESPACE)" in c["args"]
        assert {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]} == {
            "POD_NAMESPACE": "metadata.namespace"}


def test_placement_node_pins_render_as_hostname_selectors() -> None:
    # compose and systemd keep placement.node; Kubernetes did not (issue 24).
    from deploy_plans import S0_FLEET

    from inferplane.spec import parse_fleet

    pinned = S0_FLEET.replace(
        "cudagraph_capture_sizes: [1, 2, 4, 8]\n    placement:\n",
        "cudagraph_capture_sizes: [1, 2, 4, 8]\n    placement:\n      node: l40s-node-1\n",
    )
    assert pinned != S0_FLEET

    def scenario() -> Any:
        _, plan, _ = s0()
        return parse_fleet(pinned, filename="s0.yaml", base_dir="/srv"), plan, pinned

    deps = _deployments(_k8s(scenario))
    selectors = {name: d["spec"]["template"]["spec"]["nodeSelector"] for name, d in deps.items()
                 if name != "inferplane-gateway"}
    (name,) = [n for n in selectors if "qwen3-30b-a3b" in n]
    assert selectors[name] == {"nvidia.com/gpu.product": "NVIDIA-L40S",
                               "kubernetes.io/hostname": "l40s-node-1"}
    others = [s for n, s in selectors.items() if n != name]
    assert others and all("kubernetes.io/hostname" not in s for s in others)
    labelled = pinned.replace("nvidia.com/gpu.product: NVIDIA-L40S",
                              "nvidia.com/gpu.product: NVIDIA-L40S\n"
                              "        kubernetes.io/hostname: gpu-host-17")

    def scenario2() -> Any:
        _, plan, _ = s0()
        return parse_fleet(labelled, filename="s0.yaml", base_dir="/srv"), plan, labelled

    deps = _deployments(_k8s(scenario2))
    spec = deps[name]["spec"]["template"]["spec"]
    assert spec["nodeSelector"]["kubernetes.io/hostname"] == "gpu-host-17"
