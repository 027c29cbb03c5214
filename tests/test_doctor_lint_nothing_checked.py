"""`inferplane lint` on manifests that run no vLLM container says nothing was checked (exit
2) instead of "no advice", which read as "the probes are fine" (found trying `lint` on a
directory of fleet files and on a ConfigMap)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from inferplane.cli.main import _register_commands, app

runner = CliRunner()
_register_commands()  # `lint` is registered on import of its module, as main() does
MANIFESTS = Path(__file__).parent / "data" / "doctor" / "manifests"
EXAMPLES = Path(__file__).parent.parent / "examples"


def test_a_manifest_without_vllm_is_an_error_naming_the_file(tmp_path: Path) -> None:
    config_map = tmp_path / "cm.yaml"
    config_map.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    result = runner.invoke(app, ["lint", str(config_map)])
    assert result.exit_code == 2, result.output
    assert "no container runs `vllm serve`" in result.output
    assert str(config_map) in result.output and "no advice" not in result.output


def test_a_directory_without_vllm_manifests_counts_what_it_read(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a manifest")
    (tmp_path / "svc.yaml").write_text("apiVersion: v1\nkind: Service\nmetadata: {name: s}\n")
    result = runner.invoke(app, ["lint", str(tmp_path), "--json"])
    assert result.exit_code == 2
    assert "1 manifest file(s)" in result.output and "fleet file" in result.output
    # The examples directory holds fleet files, not manifests: the same refusal.
    assert runner.invoke(app, ["lint", str(EXAMPLES)]).exit_code == 2


def test_manifests_with_a_vllm_container_still_lint(tmp_path: Path) -> None:
    result = runner.invoke(app, ["lint", str(MANIFESTS / "vllm-docs-mistral.yaml"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["advice"]
