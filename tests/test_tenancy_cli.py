"""`inferplane keys`, `routes` and `usage` against a SQLite file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferplane.cli.main import _register_commands, app
from inferplane.errors import InferplaneError

runner = CliRunner()
FLEET_WITH_GATEWAY = """
gateway:
  ratelimit_headers: {mode}
models:
  - name: m
    endpoints: ["http://127.0.0.1:8100"]
"""


@pytest.fixture()
def db(tmp_path: Path) -> list[str]:
    _register_commands()
    return ["--db", f"sqlite:///{tmp_path / 'x.db'}"]


def test_keys_lifecycle_json(db: list[str]) -> None:
    r = runner.invoke(app, ["keys", "create", "team-a", "--rpm", "10", "--models", "a,b",
                            "--json", *db])  # fmt: skip
    assert r.exit_code == 0, r.output
    created = json.loads(r.stdout)
    assert created["key"].startswith("ip-") and created["allowed_models"] == ["a", "b"]
    listed = json.loads(runner.invoke(app, ["keys", "list", "--json", *db]).stdout)["keys"]
    assert [k["id"] for k in listed] == [created["id"]] and "key" not in listed[0]
    r = runner.invoke(app, ["keys", "rotate", created["id"], "--json", *db])
    rotated = json.loads(r.stdout)
    assert rotated["key"] != created["key"]
    assert runner.invoke(app, ["keys", "revoke", created["id"], *db]).exit_code == 0
    assert json.loads(runner.invoke(app, ["keys", "list", "--json", *db]).stdout)["keys"] == []
    everything = runner.invoke(app, ["keys", "list", "--all", "--json", *db]).stdout
    assert json.loads(everything)["keys"][0]["revoked_at"]


def test_bad_input_is_a_clear_error(db: list[str]) -> None:
    r = runner.invoke(app, ["keys", "create", "x", "--rpm", "0", *db])
    assert r.exit_code != 0 and "rpm" in str(r.exception)
    r = runner.invoke(app, ["routes", "set", "llama", "a=-1", *db])
    assert r.exit_code != 0 and "MODEL=WEIGHT" in str(r.exception)


def test_routes_set_show_and_usage(db: list[str]) -> None:
    r = runner.invoke(app, ["routes", "set", "llama", "v1=95", "v2=5", *db])
    assert r.exit_code == 0 and "v2 5.0%" in r.stdout
    rows = json.loads(runner.invoke(app, ["routes", "show", "--json", *db]).stdout)["routes"]
    assert [(x["target"], x["weight"]) for x in rows] == [("v1", 95.0), ("v2", 5.0)]
    r = runner.invoke(app, ["usage", "--by", "model", "--since", "7d", "--csv", *db])
    assert r.exit_code == 0 and r.stdout.startswith("model,requests,errors")
    r = runner.invoke(app, ["usage", "--by", "team", *db])
    assert r.exit_code != 0


def test_gateway_ratelimit_headers_flag_is_checked(db: list[str]) -> None:
    r = runner.invoke(app, ["gateway", "--backend", "m=http://127.0.0.1:9", "--ratelimit-headers",
                            "sometimes", *db])  # fmt: skip
    assert isinstance(r.exception, InferplaneError)
    assert "--ratelimit-headers" in str(r.exception) and "on_429" in str(r.exception)


def test_fleet_ratelimit_headers_reach_the_gateway(tmp_path: Path) -> None:
    from inferplane.spec import load_fleet
    from inferplane.tenancy.wiring import build_tenancy

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET_WITH_GATEWAY.format(mode="always"))
    db = f"sqlite:///{tmp_path / 'x.db'}"
    assert build_tenancy(load_fleet(fleet), db, announce=False).headers_on_success
    assert not build_tenancy(load_fleet(fleet), db, announce=False,
                             ratelimit_headers="on_429").headers_on_success  # fmt: skip
    assert not build_tenancy(None, db, announce=False).headers_on_success  # the default
    fleet.write_text(FLEET_WITH_GATEWAY.format(mode="sometimes"))
    with pytest.raises(InferplaneError) as err:
        load_fleet(fleet)
    assert "ratelimit_headers" in str(err.value)


def test_redis_limits_are_leased_unless_redis_sync_s_is_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from inferplane.spec import load_fleet
    from inferplane.tenancy.leased import LeasedRedisLimiter
    from inferplane.tenancy.limits import MemoryLimiter, RedisLimiter
    from inferplane.tenancy.wiring import build_limiter, redis_sync_s

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET_WITH_GATEWAY.format(mode="on_429"))
    spec = load_fleet(fleet)
    monkeypatch.delenv("INFERPLANE_REDIS_SYNC_S", raising=False)
    assert redis_sync_s(spec) == 0.5 and redis_sync_s(None) == 0.5
    url = "redis://127.0.0.1:1/0"  # clients connect lazily: nothing is contacted here
    assert isinstance(build_limiter(None, 0.5), MemoryLimiter)
    leased = build_limiter(url, redis_sync_s(spec))
    assert isinstance(leased, LeasedRedisLimiter) and leased.sync_s == 0.5
    monkeypatch.setenv("INFERPLANE_REDIS_SYNC_S", "0")
    assert isinstance(build_limiter(url, redis_sync_s(spec)), RedisLimiter)
    monkeypatch.setenv("INFERPLANE_REDIS_SYNC_S", "soon")
    with pytest.raises(InferplaneError) as err:
        redis_sync_s(spec)
    assert "INFERPLANE_REDIS_SYNC_S" in str(err.value)
