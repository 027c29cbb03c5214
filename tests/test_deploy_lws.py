"""Replicas that span nodes on Kubernetes: a LeaderWorkerSet per model (P13, P15, P24, P26,
P27, P34), its checks, and what the renderer refuses."""

from __future__ import annotations

import copy
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_plans import KUBECTL, PP_FLEET, llama70b_pp, pp_instance, s4

from inferplane.deploy import RenderOptions, render, render_files
from inferplane.deploy.checks import Doc, check_k8s_dir, schema_problems, semantic_problems
from inferplane.deploy.k8s.context import K8sContext
from inferplane.deploy.k8s.leaderworkerset import worker_prestop
from inferplane.errors import InferplaneError
from inferplane.planner.plan import LEADER_ADDRESS_TOKEN, PlanRank
from inferplane.spec import parse_fleet

LWS = "llama-3-1-70b-lws"
LWS_FILE = f"engines/{LWS}/leaderworkerset.yaml"
Docs = dict[str, list[dict[str, Any]]]


def _docs(files: dict[str, str]) -> Docs:
    return {p: [d for d in yaml.safe_load_all(t) if d] for p, t in files.items()}


def _k8s(scenario: Any = llama70b_pp, **opts: Any) -> Docs:
    fleet, plan, text = scenario()
    return _docs(render_files(fleet, plan, "k8s", RenderOptions(fleet_text=text, **opts)))


def _lws(docs: Docs) -> dict[str, Any]:
    (lws,) = docs[LWS_FILE]
    return lws


def _pods(lws: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    lwt = lws["spec"]["leaderWorkerTemplate"]
    return lwt["leaderTemplate"], lwt["workerTemplate"]


def _container(template: dict[str, Any]) -> dict[str, Any]:
    (container,) = template["spec"]["containers"]
    c: dict[str, Any] = container
    return c


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"]}


def _valid(tmp_path: Path, scenario: Any = llama70b_pp, **opts: Any) -> Path:
    fleet, plan, text = scenario()
    render(fleet, plan, "k8s", tmp_path, options=RenderOptions(fleet_text=text, **opts))
    assert [p.render() for p in check_k8s_dir(tmp_path)] == []
    return tmp_path


def test_a_leaderworkerset_replaces_the_deployment() -> None:
    docs = _k8s()
    assert not any("deployment.yaml" in p and "engines/" in p for p in docs)
    lws = _lws(docs)
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    spec = lws["spec"]
    assert spec["replicas"] == 2
    assert spec["startupPolicy"] == "LeaderCreated"
    assert spec["rolloutStrategy"] == {  # P26: one group at a time, no surge
        "type": "RollingUpdate", "rollingUpdateConfiguration": {"maxSurge": 0,
                                                                 "maxUnavailable": 1}}
    lwt = spec["leaderWorkerTemplate"]
    assert lwt["size"] == 2 and lwt["restartPolicy"] == "RecreateGroupOnPodRestart"
    # Every token substituted (the plan ConfigMap is the plan as planned, tokens and all).
    text = yaml.safe_dump({p: d for p, d in docs.items() if p != "gateway/configmap.yaml"})
    assert LEADER_ADDRESS_TOKEN not in text


def test_leader_serves_probes_and_drains() -> None:
    opts = RenderOptions()
    leader, _ = _pods(_lws(_k8s()))
    c = _container(leader)
    args = c["args"]
    assert args[args.index("--master-addr") + 1] == "$(LWS_LEADER_ADDRESS)"
    assert args[args.index("--node-rank") + 1] == "0"
    assert args[args.index("--host") + 1] == "0.0.0.0"
    assert args[args.index("--shutdown-timeout") + 1] == "300"  # P27
    assert c["resources"]["requests"]["nvidia.com/gpu"] == "2"  # TP per pod
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    budget = opts.startup_budget_s(int(131.4 * 2**30))  # the whole model's weights (P24)
    assert c["startupProbe"]["failureThreshold"] * 10 == budget
    assert c["readinessProbe"]["httpGet"]["path"] == "/v1/models"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "15"]
    env = _env(c)
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "eth0"  # not enp65s0
    assert "CUDA_VISIBLE_DEVICES" not in env  # the device plugin's GPUs (P21)
    pod = leader["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L40S"}  # P14
    assert pod["terminationGracePeriodSeconds"] == opts.grace_s()
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["sizeLimit"] == "16Gi"


def test_workers_are_headless_without_probes() -> None:
    _, worker = _pods(_lws(_k8s()))
    c = _container(worker)
    args = c["args"]
    assert args[args.index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
    assert args[args.index("--master-addr") + 1] == "$(LWS_LEADER_ADDRESS)"
    assert "--headless" in args and "--shutdown-timeout" not in args
    for key in ("ports", "startupProbe", "readinessProbe", "livenessProbe"):
        assert key not in c  # one failed probe would recreate the loading group (P24)
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    stop = c["lifecycle"]["preStop"]["exec"]["command"]
    assert stop[:2] == ["/bin/sh", "-c"] and "LWS_LEADER_ADDRESS" in stop[2]


def _serve_once(port_holder: list[int], stop: threading.Event) -> None:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        srv.settimeout(0.2)
        port_holder.append(srv.getsockname()[1])
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                conn.close()
            except TimeoutError:
                continue


@pytest.mark.skipif(shutil.which("python3") is None, reason="no python3 on PATH")
def test_worker_prestop_holds_while_the_leader_answers() -> None:
    fleet, plan, text = llama70b_pp()
    ctx = K8sContext(fleet, plan, RenderOptions(fleet_text=text))
    env = {**os.environ, "LWS_LEADER_ADDRESS": "127.0.0.1"}
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        closed_port = free.getsockname()[1]
    start = time.monotonic()
    subprocess.run(worker_prestop(ctx, closed_port), env=env, timeout=30, check=True)
    assert time.monotonic() - start < 4  # a gone leader lets the worker go at once
    ports: list[int] = []
    stop = threading.Event()
    server = threading.Thread(target=_serve_once, args=(ports, stop))
    server.start()
    while not ports:
        time.sleep(0.01)
    proc = subprocess.Popen(worker_prestop(ctx, ports[0]), env=env)
    time.sleep(1.5)
    assert proc.poll() is None  # the leader still drains: hold the stage
    stop.set()
    server.join()
    proc.wait(timeout=15)
    assert proc.returncode == 0


def test_service_and_podmonitor_select_leaders_pdb_the_group() -> None:
    docs = _k8s()
    (svc,) = docs["models/llama-3-1-70b/service.yaml"]
    assert svc["metadata"]["name"] == "llama-3-1-70b" != LWS  # not the LWS's headless name
    assert svc["spec"]["selector"] == {"model.inferplane.io/llama-3.1-70b": "true",
                                       "leaderworkerset.sigs.k8s.io/worker-index": "0"}
    (pm,) = docs["models/llama-3-1-70b/podmonitor.yaml"]
    assert pm["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
    (pdb,) = docs[f"engines/{LWS}/pdb.yaml"]
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"]["inferplane.io/workload"] == LWS
    (gw,) = docs["gateway/deployment.yaml"]
    args = gw["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--discover" in args and not [a for a in args if "://" in a]  # pods, not Services


def test_render_is_valid_and_kustomize_builds(tmp_path: Path) -> None:
    out = _valid(tmp_path)
    kust = yaml.safe_load((out / "kustomization.yaml").read_text())
    assert LWS_FILE in kust["resources"]
    if KUBECTL is None:
        pytest.skip("kubectl not installed")
    result = subprocess.run([KUBECTL, "kustomize", str(out)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    built = [d for d in yaml.safe_load_all(result.stdout) if d]
    (lws,) = [d for d in built if d["kind"] == "LeaderWorkerSet"]
    assert lws["metadata"]["namespace"] == "inferplane"


def _scaled() -> Any:
    _, plan, _ = llama70b_pp()
    text = PP_FLEET + "scaling:\n  models:\n    llama-3.1-70b: {min_replicas: 1, max_replicas: 3}\n"
    return parse_fleet(text, filename="pp.yaml", base_dir="/srv"), plan, text


@pytest.mark.parametrize("autoscaler", ["keda", "hpa"])
def test_autoscaler_targets_the_leaderworkerset(tmp_path: Path, autoscaler: str) -> None:
    docs = _k8s(_scaled, autoscaler=autoscaler)
    name = "scaledobject.yaml" if autoscaler == "keda" else "hpa.yaml"
    (scaler,) = docs[f"models/llama-3-1-70b/{name}"]
    assert scaler["spec"]["scaleTargetRef"] == {
        "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "name": LWS}
    assert "replicas" not in _lws(docs)["spec"]  # the autoscaler owns it (scale subresource)
    _valid(tmp_path, _scaled, autoscaler=autoscaler)


def test_gang_volcano_uses_the_lws_controllers_podgroups(tmp_path: Path) -> None:
    docs = _k8s(gang="volcano", gang_queue="llm")
    lws = _lws(docs)
    assert lws["metadata"]["annotations"] == {"scheduling.volcano.sh/queue-name": "llm"}
    for template in _pods(lws):
        assert template["spec"]["schedulerName"] == "volcano"
        assert "scheduling.k8s.io/group-name" not in template["metadata"]["annotations"]
    assert not any(p.endswith("podgroup.yaml") for p in docs)  # one per group, by LWS
    _valid(tmp_path, gang="volcano", gang_queue="llm")


def test_gang_kueue_labels_the_leaderworkerset(tmp_path: Path) -> None:
    lws = _lws(_k8s(gang="kueue", gang_queue="serving"))
    assert lws["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "serving"
    assert all("schedulerName" not in t["spec"] for t in _pods(lws))
    _valid(tmp_path, gang="kueue", gang_queue="serving")


@pytest.mark.parametrize("weights", ["pvc", "prewarm"])
def test_weights_options_reach_both_templates(tmp_path: Path, weights: str) -> None:
    lws = _lws(_k8s(weights=weights))
    for template in _pods(lws):
        names = {v["name"] for v in template["spec"]["volumes"]}
        assert "weights-llama-3-1-70b" in names
        if weights == "prewarm":
            assert template["spec"]["initContainers"][0]["name"] == "wait-weights"
    _valid(tmp_path, weights=weights)


def _three_nodes() -> Any:
    fleet, plan, text = llama70b_pp(nodes_per_replica=3)
    insts = []
    for inst in plan.instances:
        ranks = [r.model_copy(update={"env": {**r.env, "VLLM_STAGE_TAG": f"stage-{r.rank}"}})
                 for r in inst.ranks]
        insts.append(inst.model_copy(update={"ranks": ranks, "env": ranks[0].env}))
    return fleet, plan.model_copy(update={"instances": insts}), text


def test_three_node_replicas_template_the_rank(tmp_path: Path) -> None:
    lws = _lws(_k8s(_three_nodes))
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 3
    _, worker = _pods(lws)
    c = _container(worker)
    assert c["args"][c["args"].index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
    assert _env(c)["VLLM_STAGE_TAG"] == "stage-$(LWS_WORKER_INDEX)"
    _valid(tmp_path, _three_nodes)


def test_workers_that_differ_beyond_the_rank_are_refused() -> None:
    fleet, plan, text = llama70b_pp(nodes_per_replica=3)
    inst = plan.instances[0]
    ranks = list(inst.ranks)
    ranks[2] = ranks[2].model_copy(update={"argv": [*ranks[2].argv[:-1], "--other"]})
    bad = plan.model_copy(update={"instances": [inst.model_copy(update={"ranks": ranks}),
                                                *plan.instances[1:]]})
    with pytest.raises(InferplaneError, match="one worker template") as err:
        render_files(fleet, bad, "k8s", RenderOptions(fleet_text=text))
    assert err.value.field == "plan.instances[llama-3.1-70b-0].ranks"


def test_ray_form_keeps_the_shell_command() -> None:
    fleet, plan, text = llama70b_pp()
    head = ["bash", "-c", "ray start --head --port=6379 && exec vllm serve /m "
            "--pipeline-parallel-size 2 --distributed-executor-backend ray"]
    worker = ["bash", "-c", f"exec ray start --address={LEADER_ADDRESS_TOKEN}:6379 --block"]
    insts = []
    for inst in plan.instances:
        ranks = [inst.ranks[0].model_copy(update={"argv": head}),
                 inst.ranks[1].model_copy(update={"argv": worker})]
        insts.append(inst.model_copy(update={"ranks": ranks, "argv": head}))
    ray = plan.model_copy(update={"instances": insts})
    lws = _lws(_docs(render_files(fleet, ray, "k8s", RenderOptions(fleet_text=text))))
    leader, work = _pods(lws)
    assert _container(leader)["args"] == head  # no --shutdown-timeout after `bash -c`
    assert _container(work)["args"] == [
        "bash", "-c", "exec ray start --address=$(LWS_LEADER_ADDRESS):6379 --block"]


def test_refusals() -> None:
    fleet, plan, text = llama70b_pp()
    opts = RenderOptions(fleet_text=text)
    mixed = plan.model_copy(update={"instances": [
        plan.instances[0],
        plan.instances[1].model_copy(update={"pipeline_parallel_size": 1, "ranks": []})]})
    with pytest.raises(InferplaneError, match="span different numbers of nodes"):
        render_files(fleet, mixed, "k8s", opts)
    shared = plan.model_copy(update={"instances": [
        plan.instances[0].model_copy(update={"shares_gpu_with": ["llama-3.1-70b-1"]}),
        plan.instances[1]]})
    with pytest.raises(InferplaneError, match="cannot share its GPUs"):
        render_files(fleet, shared, "k8s", opts)
    short = plan.model_copy(update={"instances": [
        plan.instances[0].model_copy(update={"ranks": plan.instances[0].ranks[:1]}),
        plan.instances[1]]})
    with pytest.raises(InferplaneError, match="lists 1 ranks"):
        render_files(fleet, short, "k8s", opts)
    mig_text = text.replace("{name: l40s-b, gpu_type: L40S, count: 2, interconnect: pcie,",
                            "{name: l40s-b, gpu_type: L40S, count: 2, interconnect: pcie, "
                            "sharing: mig, mig_profile: 2g.24gb,")
    mig_fleet = parse_fleet(mig_text, filename="pp.yaml", base_dir="/srv")
    with pytest.raises(InferplaneError, match="MIG") as err:
        render_files(mig_fleet, plan, "k8s", RenderOptions(fleet_text=mig_text))
    assert err.value.value == "l40s-b"


def test_a_model_named_like_the_lws_is_refused() -> None:
    _, plan, _ = llama70b_pp()
    text = PP_FLEET.replace("gateway:", "  - name: llama-3.1-70b-lws\n    source: /models/x\n"
                                        "gateway:")
    clash = parse_fleet(text, filename="pp.yaml", base_dir="/srv")
    with pytest.raises(InferplaneError, match="name of a model's Service"):
        render_files(clash, plan, "k8s", RenderOptions(fleet_text=text))


# --- checks -------------------------------------------------------------------------------


def _check_docs() -> list[Doc]:
    docs = _k8s(_scaled)
    return [(p, d) for p, objs in sorted(docs.items()) for d in objs
            if d["kind"] != "Kustomization"]


def _lws_doc(docs: list[Doc]) -> dict[str, Any]:
    return next(d for _, d in docs if d["kind"] == "LeaderWorkerSet")


def _surge(docs: list[Doc]) -> None:
    _lws_doc(docs)["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]["maxSurge"] = 1


def _restart(docs: list[Doc]) -> None:
    _lws_doc(docs)["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Default"


def _leader_ready(docs: list[Doc]) -> None:
    _lws_doc(docs)["spec"]["startupPolicy"] = "LeaderReady"


def _worker_liveness(docs: list[Doc]) -> None:
    _, worker = _pods(_lws_doc(docs))
    _container(worker)["livenessProbe"] = {"tcpSocket": {"port": 29500}}


def _static_group(docs: list[Doc]) -> None:
    leader, _ = _pods(_lws_doc(docs))
    leader["metadata"]["annotations"]["scheduling.k8s.io/group-name"] = "one-for-all"


def _worker_gpu(docs: list[Doc]) -> None:
    _, worker = _pods(_lws_doc(docs))
    _container(worker)["resources"]["limits"]["nvidia.com/gpu"] = "1"


def _service_selects_workers(docs: list[Doc]) -> None:
    svc = next(d for _, d in docs if d["kind"] == "Service"
               and d["metadata"]["name"] == "llama-3-1-70b")
    svc["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] = "1"


def _service_named_like_lws(docs: list[Doc]) -> None:
    svc = copy.deepcopy(next(d for _, d in docs if d["kind"] == "Service"
                             and d["metadata"]["name"] == "llama-3-1-70b"))
    svc["metadata"]["name"] = LWS
    docs.append(("extra.yaml", svc))


def _scale_target(docs: list[Doc]) -> None:
    so = next(d for _, d in docs if d["kind"] == "ScaledObject")
    so["spec"]["scaleTargetRef"]["name"] = "gone"


@pytest.mark.parametrize(("mutate", "needle"), [
    (_surge, "maxSurge: 0"),
    (_restart, "RecreateGroupOnPodRestart"),
    (_leader_ready, "LeaderReady"),
    (_worker_liveness, "recreates the whole group"),
    (_static_group, "every group would join one gang"),
    (_worker_gpu, "requests 2 != limits 1"),
    (_service_selects_workers, "is not a port of LeaderWorkerSet/llama-3-1-70b-lws (workers)"),
    (_service_named_like_lws, "headless Service"),
    (_scale_target, "scale target LeaderWorkerSet/gone does not exist"),
])
def test_semantic_checks_understand_lws(mutate: Any, needle: str) -> None:
    docs = _check_docs()
    assert semantic_problems(docs) == []
    mutate(docs)
    messages = [p.render() for p in semantic_problems(docs)]
    assert any(needle in m for m in messages), messages


def test_schemas_check_the_lws_and_each_pod_template() -> None:
    docs = _check_docs()
    lws = _lws_doc(docs)
    only = [("lws.yaml", lws)]
    assert schema_problems(only, ("1.29", "1.33")) == []
    leader, worker = _pods(lws)
    _container(worker)["startupprobe"] = {"periodSeconds": 10}  # kubectl would drop it
    lws["spec"]["leaderWorkerTemplate"]["sizee"] = 2
    lws["spec"]["rolloutStrategy"]["type"] = "Recreate"
    messages = [p.render() for p in schema_problems(only, ("1.29", "1.33"))]
    assert sum("workerTemplate as a PodTemplateSpec" in m and "startupprobe" in m
               for m in messages) == 2, messages
    assert any("sizee" in m for m in messages)
    assert any("Recreate" in m for m in messages)
    assert not any("leaderTemplate" in m for m in messages)
    del leader["spec"]["containers"]
    assert any("leaderTemplate as a PodTemplateSpec" in p.render()
               for p in schema_problems(only, ("1.33",)))


def test_single_node_fleets_are_unchanged_by_lws_support() -> None:
    docs = _k8s(s4)
    assert not any(d["kind"] == "LeaderWorkerSet" for objs in docs.values() for d in objs)
    (svc,) = docs["models/qwen3-8b/service.yaml"]
    assert svc["spec"]["selector"] == {"model.inferplane.io/qwen3-8b": "true"}


def test_pp_instance_helper_is_coherent() -> None:
    inst = pp_instance("m", 0, ["a", "b"], source="/models/m", port=8100, weights_gib=1.0)
    assert inst.spans_nodes and [r.rank for r in inst.ranks] == [0, 1]
    assert isinstance(inst.ranks[1], PlanRank) and inst.argv == inst.ranks[0].argv


@pytest.mark.parametrize("target", ["k8s", "systemd"])
def test_real_multinode_example_renders_valid(tmp_path: Path, target: str) -> None:
    """The planner's own plan for examples/multinode-70b.yaml, end to end (no golden: the
    plan is the planner's to change)."""
    planner = pytest.importorskip("inferplane.planner.build")
    path = Path(__file__).resolve().parents[1] / "examples" / "multinode-70b.yaml"
    if not path.is_file():
        pytest.skip("no multi-node example")
    from inferplane.spec import load_fleet

    fleet = load_fleet(path)
    plan = planner.plan_fleet(fleet, fleet_file=str(path))
    render(fleet, plan, target, tmp_path,
           options=RenderOptions(fleet_text=path.read_text(encoding="utf-8")))
    from inferplane.deploy import check_dir

    assert [p.render() for p in check_dir(tmp_path)] == []
    spanning = [inst for inst in plan.instances if inst.spans_nodes]
    if target == "k8s":
        assert len(list(tmp_path.glob("engines/*-lws/leaderworkerset.yaml"))) == len(
            {inst.model for inst in spanning})
    elif spanning:
        assert (tmp_path / "README.md").is_file()


def test_apply_names_the_missing_lws_controller(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("kubernetes")
    from kubernetes.dynamic.exceptions import ResourceNotFoundError

    from inferplane.deploy import apply

    class _Resources:
        def get(self, api_version: str, kind: str) -> object:
            if kind == "LeaderWorkerSet":
                raise ResourceNotFoundError(f"No matches found for {api_version} {kind}")
            return object()

    class _Client:
        resources = _Resources()

        def server_side_apply(self, *args: object, **kwargs: object) -> None:
            return None

    monkeypatch.setattr(apply, "_client", lambda: _Client())
    out = _valid(tmp_path)
    with pytest.raises(InferplaneError, match=r"no API for leaderworkerset\.x-k8s\.io/v1") as err:
        apply.apply_dir(out, dry_run_only=True)
    assert "kubernetes-sigs/lws" in (err.value.fix or "")
