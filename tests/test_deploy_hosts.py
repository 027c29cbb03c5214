"""compose and systemd: replicas that span nodes, and the options that are Kubernetes-only
(refused, never ignored) or have a host equivalent (`--weights prewarm`, P35)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from deploy_plans import MIG_FLEET, llama70b_pp, mig, s0_hami, s4
from typer.testing import CliRunner

from inferplane.cli.main import _register_commands, app
from inferplane.deploy import RenderOptions, check_dir, render, render_files
from inferplane.deploy.hosts import host_of
from inferplane.errors import InferplaneError
from inferplane.planner.plan import LEADER_ADDRESS_TOKEN

runner = CliRunner()
_register_commands()


def _render(tmp_path: Path, scenario: Any, target: str, **opts: Any) -> Path:
    fleet, plan, text = scenario()
    render(fleet, plan, target, tmp_path, options=RenderOptions(fleet_text=text, **opts))
    return tmp_path


# --- replicas that span nodes -------------------------------------------------------------


def test_compose_refuses_a_replica_across_hosts() -> None:
    fleet, plan, text = llama70b_pp()
    with pytest.raises(InferplaneError) as err:
        render_files(fleet, plan, "compose", RenderOptions(fleet_text=text))
    message = str(err.value)
    assert "llama-3.1-70b replica 0 spans 2 nodes (l40s-a, l40s-b)" in message
    assert "--target k8s" in message and "--target systemd" in message


def test_systemd_one_unit_per_rank_on_its_node(tmp_path: Path) -> None:
    root = _render(tmp_path, llama70b_pp, "systemd")
    leader = (root / "l40s-a/inferplane-llama-3-1-70b-0-rank0.service").read_text()
    worker = (root / "l40s-b/inferplane-llama-3-1-70b-0-rank1.service").read_text()
    assert not (root / "l40s-a/inferplane-llama-3-1-70b-0-rank1.service").exists()
    for unit in (leader, worker):
        assert LEADER_ADDRESS_TOKEN not in unit
        assert "--master-addr l40s-a " in unit  # the leader's host
        assert "Environment=CUDA_VISIBLE_DEVICES=0,1" in unit
        assert "Restart=always" in unit and "LimitNOFILE=65536" in unit
    assert "--node-rank 0" in leader and "--host 0.0.0.0" in leader
    assert "--shutdown-timeout 300" in leader and "ExecStop=" not in leader
    assert "--node-rank 1" in worker and "--headless" in worker
    assert "--shutdown-timeout" not in worker
    assert "http://l40s-a:8100/health" in worker.split("ExecStop=", 1)[1]  # holds its stage
    gateway = (root / "l40s-a/inferplane-gateway.service").read_text()
    assert "--backend llama-3.1-70b=http://127.0.0.1:8100" in gateway  # leaders only
    assert "--backend llama-3.1-70b=http://l40s-c:8100" in gateway
    assert "l40s-b" not in gateway and "l40s-d" not in gateway
    target_b = (root / "l40s-b/inferplane.target").read_text()
    assert "Wants=inferplane-llama-3-1-70b-0-rank1.service" in target_b
    readme = (root / "README.md").read_text()
    assert "| `l40s-b/` | l40s-b | `inferplane-llama-3-1-70b-0-rank1.service` |" in readme
    assert "| llama-3.1-70b-1 | 0 (leader) | l40s-c |" in readme
    assert check_dir(root) == []


def test_systemd_single_node_plans_get_no_index(tmp_path: Path) -> None:
    assert not (_render(tmp_path, s4, "systemd") / "README.md").exists()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_analyze_verify_accepts_rank_and_prewarm_units(tmp_path: Path) -> None:
    root = _render(tmp_path, llama70b_pp, "systemd", weights="prewarm")
    for node in ("l40s-a", "l40s-b", "l40s-c", "l40s-d"):
        units = sorted(str(p) for p in (root / node).glob("*.service"))
        result = subprocess.run(["systemd-analyze", "verify", "--man=no", *units],
                                capture_output=True, text=True, timeout=60, check=False)
        problems = [line for line in result.stderr.splitlines()
                    if "Command /usr/bin/env" not in line and "not found" not in line
                    and "is not executable" not in line and line.strip()]
        assert problems == [], result.stderr
    assert check_dir(root) == []


def test_worker_stop_lets_a_dead_worker_restart_at_once() -> None:
    from inferplane.deploy.systemd_ranks import worker_stop

    script = worker_stop("127.0.0.1", 1, RenderOptions())
    result = subprocess.run(["/bin/sh", "-c", script], env={"PATH": "/usr/bin:/bin"},
                            timeout=10, check=False)
    assert result.returncode == 0  # no $MAINPID: the worker already exited


def test_host_of_prefers_an_inventory_address() -> None:
    node = SimpleNamespace(address="10.0.0.7")
    fleet = SimpleNamespace(gpus=SimpleNamespace(node=lambda name: node))
    assert host_of(fleet, "gpu-1") == "10.0.0.7"  # type: ignore[arg-type]
    fleet_plain, _, _ = llama70b_pp()
    assert host_of(fleet_plain, "l40s-a") == "l40s-a"


# --- options that only Kubernetes has -----------------------------------------------------


@pytest.mark.parametrize("target", ["compose", "systemd"])
@pytest.mark.parametrize(("opts", "field"), [
    ({"gang": "volcano"}, "--gang"),
    ({"gang": "kueue"}, "--gang"),
    ({"weights": "pvc"}, "--weights"),
    ({"ingress_host": "llm.example.com"}, "--ingress-host"),
    ({"inference_pool": True}, "--inference-pool"),
])
def test_kubernetes_only_options_are_refused(target: str, opts: dict[str, Any],
                                             field: str) -> None:
    fleet, plan, text = s4()
    with pytest.raises(InferplaneError) as err:
        render_files(fleet, plan, target, RenderOptions(fleet_text=text, **opts))
    assert err.value.field == field
    assert f"--target {target}" in str(err.value)
    assert err.value.fix


@pytest.mark.parametrize("target", ["compose", "systemd"])
def test_mig_nodes_are_refused(target: str) -> None:
    fleet, plan, text = mig()
    with pytest.raises(InferplaneError, match=r"MIG 3g\.40gb slices") as err:
        render_files(fleet, plan, target, RenderOptions(fleet_text=text))
    assert err.value.field == "gpus.nodes.sharing" and "h100-mig-1" in str(err.value.value)
    assert "sharing: mig" in MIG_FLEET


@pytest.mark.parametrize("target", ["compose", "systemd"])
def test_hami_nodes_share_whole_cards_by_fraction(tmp_path: Path, target: str) -> None:
    """HAMi is a Kubernetes device plugin; on a host the plan's fractions are the sharing."""
    root = _render(tmp_path, s0_hami, target)
    assert check_dir(root) == []


def test_cli_refuses_gang_for_compose(tmp_path: Path) -> None:
    fleet_file = tmp_path / "s4.yaml"
    _, plan, text = s4()
    fleet_file.write_text(text)
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(plan.model_dump_json())
    result = runner.invoke(app, ["render", str(fleet_file), "--plan", str(plan_file),
                                 "--target", "compose", "--out", str(tmp_path / "o"),
                                 "--gang", "volcano"])
    assert isinstance(result.exception, InferplaneError)
    assert result.exception.field == "--gang"
    assert not (tmp_path / "o").exists()


# --- --weights prewarm on hosts (P35) ------------------------------------------------------


def test_compose_prewarm_copies_once_then_mounts_the_copy(tmp_path: Path) -> None:
    root = _render(tmp_path, s4, "compose", weights="prewarm")
    doc = yaml.safe_load((root / "h100-node-1/compose.yaml").read_text())
    services = doc["services"]
    copy = services["prewarm-qwen3-32b"]
    assert copy["restart"] == "no"
    assert copy["volumes"] == ["/var/lib/inferplane/models:/prewarm",
                               "/models/Qwen--Qwen3-32B:/source:ro"]
    script = copy["entrypoint"][2]
    assert "$$(cat /prewarm/qwen3-32b.complete" in script  # no compose interpolation
    engine = services["qwen3-32b-0"]
    assert engine["depends_on"]["prewarm-qwen3-32b"] == {
        "condition": "service_completed_successfully"}
    assert engine["volumes"] == [
        "/var/lib/inferplane/models/qwen3-32b:/models/Qwen--Qwen3-32B:ro"]
    plain = yaml.safe_load(render_files(*s4()[:2], "compose", RenderOptions(
        fleet_text=s4()[2]))["h100-node-1/compose.yaml"])["services"]["qwen3-32b-0"]
    assert (int(engine["healthcheck"]["start_period"].rstrip("s"))
            < int(plain["healthcheck"]["start_period"].rstrip("s")))  # local NVMe (P24)
    hub = services["qwen3-8b-0"]
    assert hub["environment"]["HF_HUB_OFFLINE"] == "1"
    assert hub["volumes"] == ["/var/lib/inferplane/models/qwen3-8b/hub/models--Qwen--Qwen3-8B:"
                              "/root/.cache/huggingface/hub/models--Qwen--Qwen3-8B:ro"]
    assert "volumes" not in doc  # no shared hf-cache volume needed
    assert check_dir(root) == []


def test_compose_prewarm_script_runs(tmp_path: Path) -> None:
    """The copy the service runs, with compose's `$$` undone and the mounts faked."""
    root = _render(tmp_path / "out", s4, "compose", weights="prewarm")
    doc = yaml.safe_load((root / "h100-node-1/compose.yaml").read_text())
    script = doc["services"]["prewarm-qwen3-32b"]["entrypoint"][2].replace("$$", "$")
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (src / "config.json").write_text("{}")
    script = script.replace("/source", str(src)).replace("/prewarm", str(dst))
    for _ in range(2):  # idempotent
        subprocess.run(["/bin/sh", "-c", script], check=True, timeout=30)
    assert (dst / "qwen3-32b/config.json").read_text() == "{}"
    assert (dst / "qwen3-32b.complete").read_text() == "/models/Qwen--Qwen3-32B"


def test_systemd_prewarm_unit_and_engine_binds(tmp_path: Path) -> None:
    root = _render(tmp_path, s4, "systemd", weights="prewarm")
    node = root / "h100-node-1"
    copy = (node / "inferplane-prewarm-qwen3-32b.service").read_text()
    assert "Type=oneshot" in copy and "RemainAfterExit=yes" in copy
    assert "cp -a /models/Qwen--Qwen3-32B/. /var/lib/inferplane/models/qwen3-32b.partial/" in copy
    engine = (node / "inferplane-qwen3-32b-0.service").read_text()
    assert "Requires=inferplane-prewarm-qwen3-32b.service" in engine
    assert ("BindReadOnlyPaths=/var/lib/inferplane/models/qwen3-32b:/models/Qwen--Qwen3-32B"
            in engine)
    hub = (node / "inferplane-qwen3-8b-0.service").read_text()
    assert "Environment=HF_HOME=/var/lib/inferplane/models/qwen3-8b" in hub
    assert "Environment=HF_HUB_OFFLINE=1" in hub
    target = (node / "inferplane.target").read_text()
    assert "inferplane-prewarm-qwen3-8b.service" in target
    assert check_dir(root) == []
