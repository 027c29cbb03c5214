"""Renders of a model with LoRA adapters: Kubernetes, compose and systemd carry vLLM's LoRA
flags and the run-time loading variable, and mount each adapter directory (Kubernetes
`--weights pvc`: from the model's own weights volume); the strict checks still pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from lora_adapters import make_adapter
from planner_fleets import fleet

from inferplane.deploy import RenderOptions, check_dir, render
from inferplane.deploy.checks import check_k8s_dir
from inferplane.planner import plan_fleet
from inferplane.spec import FleetSpec

FLEET = """
gpus:
  nodes: [{{name: a, gpu_type: H100-SXM-80GB, count: 1}}]
models:
  - name: llama
    source: meta-llama--Llama-3.1-8B-Instruct
    max_model_len: 8192
    lora:
      max_loras: 2
      adapters:
        - {{name: sql, source: {root}/sql}}
        - {{name: support, source: {root}/support}}
"""


def _planned(tmp_path: Path) -> tuple[FleetSpec, Any, str, Path]:
    root = tmp_path / "adapters"
    for name in ("sql", "support"):
        make_adapter(root / name, "meta-llama--Llama-3.1-8B-Instruct")
    text = FLEET.format(root=root)
    spec = fleet(text)
    return spec, plan_fleet(spec), text, root


def _engine(out: Path) -> dict[str, Any]:
    for path in out.rglob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "Deployment" and "llama" in doc["metadata"]["name"]:
                return doc
    raise AssertionError("no engine Deployment rendered")


def test_kubernetes_hostpath_mounts_each_adapter_at_its_path(tmp_path: Path) -> None:
    spec, plan, text, root = _planned(tmp_path)
    out = tmp_path / "k8s"
    render(spec, plan, "k8s", out, options=RenderOptions(fleet_text=text))
    pod = _engine(out)["spec"]["template"]["spec"]
    [container] = pod["containers"]
    args = container["args"]
    at = args.index("--lora-modules")
    assert args[at + 1:at + 3] == [f"sql={root}/sql", f"support={root}/support"]
    assert "--enable-lora" in args and args[args.index("--max-loras") + 1] == "2"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for name in ("sql", "support"):
        mount = mounts[f"{root}/{name}"]
        assert mount["readOnly"] is True
        assert volumes[mount["name"]]["hostPath"] == {"path": f"{root}/{name}",
                                                      "type": "Directory"}
    assert check_k8s_dir(out) == []


def test_kubernetes_pvc_reads_adapters_from_the_models_weights_volume(tmp_path: Path) -> None:
    spec, plan, text, _root = _planned(tmp_path)
    out = tmp_path / "k8s"
    render(spec, plan, "k8s", out, options=RenderOptions(fleet_text=text, weights="pvc"))
    pod = _engine(out)["spec"]["template"]["spec"]
    [container] = pod["containers"]
    args = container["args"]
    at = args.index("--lora-modules")
    assert args[at + 1:at + 3] == ["sql=/adapters/sql-0", "support=/adapters/support-1"]
    by_path = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert by_path["/adapters/sql-0"] == {"name": "weights-llama", "mountPath":
                                          "/adapters/sql-0", "subPath": "lora/sql",
                                          "readOnly": True}
    assert [v["name"] for v in pod["volumes"]].count("weights-llama") == 1
    assert check_k8s_dir(out) == []


def test_compose_and_systemd_carry_flags_and_adapter_dirs(tmp_path: Path) -> None:
    spec, plan, text, root = _planned(tmp_path)
    compose_dir, systemd_dir = tmp_path / "compose", tmp_path / "systemd"
    render(spec, plan, "compose", compose_dir, options=RenderOptions(fleet_text=text))
    render(spec, plan, "systemd", systemd_dir, options=RenderOptions(fleet_text=text))
    doc = yaml.safe_load(next(compose_dir.rglob("compose.yaml")).read_text())
    service = next(s for n, s in doc["services"].items() if n.startswith("llama"))
    assert f"{root}/sql:{root}/sql:ro" in service["volumes"]
    assert "--enable-lora" in service["command"]
    assert service["environment"]["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    unit = next(systemd_dir.rglob("inferplane-llama-0.service")).read_text()
    assert f"AssertPathIsDirectory={root}/sql" in unit
    assert "--lora-modules" in unit and "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in unit
    assert check_dir(compose_dir) == [] and check_dir(systemd_dir) == []
