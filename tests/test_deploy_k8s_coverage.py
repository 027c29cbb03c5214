"""Every fleet field is carried by the Kubernetes render or named in a warning (issue 24)."""

from __future__ import annotations

import json
import types
import typing
from typing import Any

import pytest
import yaml
from deploy_plans import S0_FLEET, s0
from pydantic import BaseModel

from inferplane.deploy import RenderOptions, render_warnings
from inferplane.deploy.k8s.coverage import FIELDS
from inferplane.spec import FleetSpec, parse_fleet


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The spec models a field's type holds (through Optional, list, dict, Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if typing.get_origin(annotation) is typing.Annotated:
        return _models_in(typing.get_args(annotation)[0])
    out: list[type[BaseModel]] = []
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, list, dict):
        for arg in typing.get_args(annotation):
            out += _models_in(arg)
    return out


def _leaves(model: type[BaseModel], prefix: str = "") -> set[str]:
    paths: set[str] = set()
    for name, field in model.model_fields.items():
        inner = _models_in(field.annotation)
        if not inner:
            paths.add(prefix + name)
        for sub in inner:
            paths |= _leaves(sub, f"{prefix}{name}.")
    return paths


def test_every_fleet_field_is_rendered_planned_read_by_the_gateway_or_warned() -> None:
    leaves = _leaves(FleetSpec)
    assert "models.placement.node" in leaves and "scaling.models.sleep.level" in leaves
    missing = sorted(leaves - set(FIELDS))
    assert not missing, (
        f"fleet fields the Kubernetes render neither carries nor warns about: {missing}; "
        "place each in inferplane/deploy/k8s/coverage.py FIELDS (and warn if it is lost)")
    assert sorted(set(FIELDS) - leaves) == []  # no stale entries


def _fleet(edit: dict[str, Any]) -> FleetSpec:
    data = yaml.safe_load(S0_FLEET)
    for key, value in edit.items():
        data[key] = value
    return parse_fleet(yaml.safe_dump(data), filename="s0.yaml", base_dir="/srv")


def _warnings(edit: dict[str, Any], **opts: Any) -> list[str]:
    _, plan, text = s0()
    return render_warnings(_fleet(edit), plan, "k8s", RenderOptions(fleet_text=text, **opts))


def test_a_plain_fleet_with_shared_stores_renders_without_warnings() -> None:
    shared = {"gateway": {"database_url": "postgresql://db.internal/inferplane",
                          "redis_url": "redis://redis:6379/0"}}
    assert _warnings(shared) == []
    assert render_warnings(_fleet(shared), s0()[1], "compose", RenderOptions()) == []


@pytest.mark.parametrize(
    ("edit", "opts", "needle"),
    [
        ({"gateway": {}}, {}, "gateway.database_url is not set: each of the 2 gateway pods"),
        ({"gateway": {}}, {}, "gateway.redis_url is not set"),
        ({"gateway": {"database_url": "postgresql://u:secret@db/x", "redis_url": "redis://r"}},
         {}, "holds a password"),
        ({"gateway": {"access_log_path": "/var/log/gw.jsonl"}}, {}, "gateway.access_log_path"),
        ({"gateway": {"console": True}}, {}, "gateway.console"),
        ({"gateway": {"console_allowed_hosts": ["llm.example.com"]}}, {},
         "gateway.console_allowed_hosts"),
        ({"gateway": {"metrics_token_env": "SCRAPE_TOKEN"}}, {}, "$SCRAPE_TOKEN"),
        ({"scaling": {"policy": {"target_ttft_p95_s": 2.0}}}, {},
         "scaling.policy.target_ttft_p95_s"),
        ({"scaling": {"models": {"qwen3-embedding-0.6b": {"max_replicas": 4}}}},
         {"autoscaler": "none"}, "--autoscaler none renders no autoscaler"),
        ({"scaling": {"models": {"qwen3-embedding-0.6b": {"min_replicas": 0,
                                                           "max_replicas": 4}}}},
         {"autoscaler": "hpa"}, "0 is not possible with an HPA"),
        ({"scaling": {"models": {"qwen3-embedding-0.6b": {"max_replicas": 4,
                                                           "sleep": {"level": 1}}}}},
         {}, "scaling.models.qwen3-embedding-0.6b.sleep"),
    ],
)
def test_what_kubernetes_cannot_express_is_a_warning(
    edit: dict[str, Any], opts: dict[str, Any], needle: str
) -> None:
    got = _warnings(edit, **opts)
    assert any(needle in w for w in got), got


def test_render_prints_the_warnings(tmp_path: Any) -> None:
    from typer.testing import CliRunner

    from inferplane.cli.main import _register_commands, app

    _, plan, _ = s0()
    fleet = tmp_path / "s0.yaml"
    data = yaml.safe_load(S0_FLEET)
    data["gateway"] = {"access_log_path": "/tmp/gw.log"}
    fleet.write_text(yaml.safe_dump(data))
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(plan.model_dump_json())
    _register_commands()
    r = CliRunner().invoke(app, ["render", str(fleet), "--plan", str(plan_file),
                                 "--out", str(tmp_path / "out"), "--json"])
    assert r.exit_code == 0, r.output
    body = json.loads(r.stdout.strip().splitlines()[-1])
    assert any("gateway.access_log_path" in w for w in body["warnings"])
