"""Kubernetes render options beyond the defaults: weights PVC / pre-warm (P35), Kueue /
Volcano gang scheduling (P15), MIG and HAMi slices instead of the UUID hand-off (S0, P18)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_plans import MIG_FLEET, mig, s0, s0_hami, s4

from inferplane.deploy import RenderOptions, render, render_files
from inferplane.deploy.checks import check_k8s_dir
from inferplane.deploy.k8s.context import K8sContext
from inferplane.deploy.k8s.weights import PREWARM_MOUNT, SOURCE_MOUNT, copy_script
from inferplane.errors import InferplaneError
from inferplane.spec import parse_fleet

Docs = dict[str, list[dict[str, Any]]]


def _k8s(scenario: Any, **opts: Any) -> Docs:
    fleet, plan, text = scenario()
    files = render_files(fleet, plan, "k8s", RenderOptions(fleet_text=text, **opts))
    return {p: [d for d in yaml.safe_load_all(t) if d] for p, t in files.items()}


def _pod(docs: Docs, workload: str) -> dict[str, Any]:
    (dep,) = docs[f"engines/{workload}/deployment.yaml"]
    pod: dict[str, Any] = dep["spec"]["template"]["spec"]
    return pod


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"]}


def _valid(tmp_path: Path, scenario: Any, **opts: Any) -> Path:
    fleet, plan, text = scenario()
    render(fleet, plan, "k8s", tmp_path, options=RenderOptions(fleet_text=text, **opts))
    assert [p.render() for p in check_k8s_dir(tmp_path)] == []
    return tmp_path


# --- weights (P35) ---------------------------------------------------------------------------


def test_weights_pvc_per_model_read_only(tmp_path: Path) -> None:
    docs = _k8s(s4, weights="pvc", weights_storage_class="nfs-ro")
    (claim,) = docs["models/deepseek-r1/pvc.yaml"]
    assert claim["spec"]["accessModes"] == ["ReadOnlyMany"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "771Gi"  # 642 GiB x 1.2
    assert claim["spec"]["storageClassName"] == "nfs-ro"
    pod = _pod(docs, "deepseek-r1")
    vol = next(v for v in pod["volumes"] if v["name"] == "weights-deepseek-r1")
    assert vol == {"name": "weights-deepseek-r1",
                   "persistentVolumeClaim": {"claimName": "weights-deepseek-r1",
                                             "readOnly": True}}
    (c,) = pod["containers"]
    assert {"name": "weights-deepseek-r1", "mountPath": "/models/deepseek-ai--DeepSeek-R1",
            "readOnly": True} in c["volumeMounts"]
    # A Hugging Face id: the PVC holds its cache directory; no hostPath cache, offline.
    hf_pod = _pod(docs, "qwen3-8b")
    (hf,) = hf_pod["containers"]
    assert {"name": "weights-qwen3-8b",
            "mountPath": "/root/.cache/huggingface/hub/models--Qwen--Qwen3-8B",
            "readOnly": True} in hf["volumeMounts"]
    assert _env(hf)["HF_HUB_OFFLINE"] == "1"
    assert not any("hostPath" in v for v in hf_pod["volumes"])
    assert "storageClassName" not in _k8s(s4, weights="pvc")["models/qwen3-8b/pvc.yaml"][0][
        "spec"]
    _valid(tmp_path, s4, weights="pvc", weights_storage_class="nfs-ro")


def test_check_catches_a_missing_claim(tmp_path: Path) -> None:
    out = _valid(tmp_path, s4, weights="pvc")
    kust = out / "kustomization.yaml"
    kust.write_text(kust.read_text().replace("- models/qwen3-32b/pvc.yaml\n", ""))
    problems = [p.render() for p in check_k8s_dir(out)]
    assert any("PersistentVolumeClaim weights-qwen3-32b is not rendered" in p
               for p in problems)


def test_prewarm_daemonset_and_shorter_startup(tmp_path: Path) -> None:
    default = _pod(_k8s(s4), "deepseek-r1")
    docs = _k8s(s4, weights="prewarm")
    pod = _pod(docs, "deepseek-r1")
    (wait,) = pod["initContainers"]
    assert wait["name"] == "wait-weights" and "nvidia.com/gpu" not in wait["resources"][
        "requests"]
    assert f"{PREWARM_MOUNT}/deepseek-r1.complete" in wait["command"][2]
    vol = next(v for v in pod["volumes"] if v["name"] == "weights-deepseek-r1")
    assert vol["hostPath"]["path"] == "/var/lib/inferplane/models/deepseek-r1"
    # Loading from local NVMe: the probe budget shrinks; the Deployment's deadline grows.
    fail = pod["containers"][0]["startupProbe"]["failureThreshold"]
    assert fail < default["containers"][0]["startupProbe"]["failureThreshold"] / 3
    (dep,) = docs["engines/deepseek-r1/deployment.yaml"]
    assert dep["spec"]["progressDeadlineSeconds"] > 2 * 642 * 1024 / 200
    (ds,) = docs["models/deepseek-r1/prewarm.yaml"]
    assert ds["kind"] == "DaemonSet"
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {"inferplane.io/gpu-type": "H200"}
    hf_ds = docs["models/qwen3-8b/prewarm.yaml"][0]["spec"]["template"]["spec"]
    assert "snapshot_download" in hf_ds["initContainers"][0]["command"][2]
    hf_vol = next(v for v in _pod(docs, "qwen3-8b")["volumes"]
                  if v["name"] == "weights-qwen3-8b")
    assert hf_vol["hostPath"]["path"] == (
        "/var/lib/inferplane/models/qwen3-8b/hub/models--Qwen--Qwen3-8B")
    _valid(tmp_path, s4, weights="prewarm")


def test_prewarm_copy_script_is_idempotent(tmp_path: Path) -> None:
    fleet, plan, text = s0()
    ctx = K8sContext(fleet, plan, RenderOptions(fleet_text=text, weights="prewarm"))
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "sub").mkdir(parents=True)
    (src / "model.safetensors").write_bytes(b"w" * 100)
    (src / "sub" / "config.json").write_text("{}")
    dst.mkdir()
    script = copy_script(ctx, "gemma-3-27b-it").replace(
        PREWARM_MOUNT, str(dst)).replace(SOURCE_MOUNT, str(src))

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True,
                              timeout=30, check=False)

    first = run()
    assert first.returncode == 0, first.stderr
    assert (dst / "gemma-3-27b-it" / "sub" / "config.json").read_text() == "{}"
    marker = dst / "gemma-3-27b-it.complete"
    assert marker.read_text() == "/models/google--gemma-3-27b-it"
    assert not (dst / "gemma-3-27b-it.partial").exists()
    second = run()
    assert second.returncode == 0 and "already on this node" in second.stdout
    marker.write_text("/models/other")  # the source changed: copy again
    assert "copied to" in run().stdout


def test_weights_option_errors() -> None:
    with pytest.raises(InferplaneError, match="weights mode"):
        RenderOptions(weights="nfs")  # type: ignore[arg-type]
    with pytest.raises(InferplaneError, match="Kubernetes object name"):
        RenderOptions(weights_storage_class="Fast_SSD")
    with pytest.raises(InferplaneError, match="at least as large"):
        RenderOptions(weights_headroom=0.5)


# --- gang scheduling (P15) -------------------------------------------------------------------


def test_volcano_podgroup_for_multi_gpu_models(tmp_path: Path) -> None:
    docs = _k8s(s4, gang="volcano", gang_queue="llm")
    (pg,) = docs["engines/deepseek-r1/podgroup.yaml"]
    assert pg["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert pg["spec"]["minMember"] == 1  # pods per replica: a TP group is one pod
    assert pg["spec"]["minResources"]["nvidia.com/gpu"] == "8"
    assert pg["spec"]["queue"] == "llm"
    (dep,) = docs["engines/deepseek-r1/deployment.yaml"]
    template = dep["spec"]["template"]
    assert template["spec"]["schedulerName"] == "volcano"
    assert template["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "deepseek-r1"
    assert "engines/qwen3-32b/podgroup.yaml" in docs  # TP 2
    assert "engines/qwen3-8b/podgroup.yaml" not in docs  # one GPU: nothing to gang
    assert "schedulerName" not in _pod(docs, "qwen3-8b")
    out = _valid(tmp_path, s4, gang="volcano")
    pg_file = out / "engines/deepseek-r1/podgroup.yaml"
    pg_file.write_text(pg_file.read_text().replace("minMember: 1", "minMember: 1\n  minMembers: 1"))
    assert any("minMembers" in p.render() for p in check_k8s_dir(out))
    pg_file.write_text(pg_file.read_text().replace("  minMembers: 1\n", "").replace(
        "nvidia.com/gpu: '8'", "nvidia.com/gpu: '4'"))
    assert [p.message for p in check_k8s_dir(out)] == [
        "PodGroup deepseek-r1 minResources nvidia.com/gpu 4 != minMember x the pod's GPUs (8)"]


def test_kueue_queue_label_on_multi_gpu_deployments(tmp_path: Path) -> None:
    docs = _k8s(s4, gang="kueue", gang_queue="serving")
    labels = {name: docs[f"engines/{name}/deployment.yaml"][0]["metadata"]["labels"]
              for name in ("deepseek-r1", "qwen3-32b", "qwen3-8b")}
    assert labels["deepseek-r1"]["kueue.x-k8s.io/queue-name"] == "serving"
    assert labels["qwen3-32b"]["kueue.x-k8s.io/queue-name"] == "serving"
    assert "kueue.x-k8s.io/queue-name" not in labels["qwen3-8b"]
    assert not any(p.endswith("podgroup.yaml") for p in docs)
    _valid(tmp_path, s4, gang="kueue")


def test_gang_option_errors() -> None:
    with pytest.raises(InferplaneError, match="gang scheduler"):
        RenderOptions(gang="yunikorn")  # type: ignore[arg-type]
    with pytest.raises(InferplaneError, match="Kubernetes object name"):
        RenderOptions(gang_queue="Team A")


# --- MIG and HAMi (S0, P18) --------------------------------------------------------------------


def test_mig_slices_replace_the_uuid_handoff(tmp_path: Path) -> None:
    pod = _pod(_k8s(mig), "qwen3-embedding-0-6b-qwen3-8b")
    emb, llm = pod["containers"]
    for c in (emb, llm):
        assert c["resources"]["requests"]["nvidia.com/mig-3g.40gb"] == "1"
        assert c["resources"]["limits"] == {"nvidia.com/mig-3g.40gb": "1"}
        assert "NVIDIA_VISIBLE_DEVICES" not in _env(c)
        assert "nvidia-smi" not in c["command"][2]
    assert not any(v["name"] == "gpu-handoff" for v in pod["volumes"])
    # The plan's bytes, as a fraction of the 40 GB slice: 0.4 x 79.2 / 37.25 GiB.
    assert llm["args"][llm["args"].index("--gpu-memory-utilization") + 1] == "0.85"
    assert "127.0.0.1:8100/health" in llm["command"][2]  # start order kept (S0)
    _valid(tmp_path, mig)


def test_mig_slice_too_small_or_tp_group_is_an_error() -> None:
    with pytest.raises(InferplaneError, match=r"MIG 1g\.10gb slice"):
        _k8s(lambda: mig("1g.10gb"))
    fleet, plan, text = mig()
    tp2 = plan.model_copy(update={"instances": [
        plan.instances[0].model_copy(update={"tensor_parallel_size": 2}), plan.instances[1]]})
    with pytest.raises(InferplaneError, match="cannot span MIG slices"):
        render_files(fleet, tp2, "k8s", RenderOptions(fleet_text=text))


def test_hami_vgpu_per_container(tmp_path: Path) -> None:
    pod = _pod(_k8s(s0_hami), "qwen3-embedding-0-6b-qwen3-32b-fp8")
    emb, llm = pod["containers"]
    assert emb["resources"]["limits"] == {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4149",
                                          "nvidia.com/gpucores": "8"}
    assert llm["resources"]["limits"]["nvidia.com/gpucores"] == "91"
    mem = int(llm["resources"]["limits"]["nvidia.com/gpumem"])
    assert mem == pytest.approx((0.87 * 44.39 + 0.5) * 1024, abs=1)
    util = float(llm["args"][llm["args"].index("--gpu-memory-utilization") + 1])
    assert util * mem == pytest.approx(0.87 * 44.39 * 1024, rel=0.002)
    assert "NVIDIA_VISIBLE_DEVICES" not in _env(llm)
    _valid(tmp_path, s0_hami)


def test_p18_check_still_flags_two_whole_gpu_containers(tmp_path: Path) -> None:
    out = _valid(tmp_path, s0)
    dep = out / "engines/qwen3-embedding-0-6b-gemma-3-27b-it/deployment.yaml"
    text = dep.read_text()
    assert text.count("nvidia.com/gpu: '1'") == 2  # first container: requests and limits
    dep.write_text(text.replace("            memory: 18Gi\n",
                                "            memory: 18Gi\n            nvidia.com/gpu: '1'\n"))
    assert any("P18" in p.message for p in check_k8s_dir(out))


def test_inventory_sharing_fields() -> None:
    fleet = parse_fleet(MIG_FLEET, filename="mig.yaml", base_dir="/srv")
    assert fleet.gpus is not None
    node = fleet.gpus.nodes[0]
    assert (node.sharing, node.mig_profile) == ("mig", "3g.40gb")
    assert node.mig_memory_gib == pytest.approx(37.25, abs=0.01)
    for bad, message in (
        (MIG_FLEET.replace("      mig_profile: 3g.40gb\n", ""), "needs a mig_profile"),
        (MIG_FLEET.replace("3g.40gb", "3g40"), "MIG profile"),
        (MIG_FLEET.replace("sharing: mig", "sharing: hami"), "only used with"),
        (MIG_FLEET.replace("sharing: mig", "sharing: vgpu"), "sharing"),
    ):
        with pytest.raises(Exception, match=message):
            parse_fleet(bad, filename="mig.yaml", base_dir="/srv")
