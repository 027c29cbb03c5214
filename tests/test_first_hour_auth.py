"""`gateway.auth: auto` never surprises (issue 28, item 4): the first `keys create` on a
live fleet says what it does to the gateway (and needs --enable-auth), `status` reports
the live auth state, and the console stays reachable with the admin token `up` generated
(printed once, kept 0600) when none was set."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from inferplane.runtime import registry
from inferplane.tenancy.service import Tenancy

ENDPOINT_FLEET = 'models:\n  - name: m\n    endpoints: ["http://127.0.0.1:9"]\n'


def _cli(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inferplane", *args], capture_output=True, text=True,
        timeout=60, cwd=cwd, env={**env, "NO_COLOR": "1", "COLUMNS": "200"},
    )  # fmt: skip


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items()
           if k not in ("INFERPLANE_ADMIN_TOKEN", "INFERPLANE_DATABASE_URL")}
    out[registry.REGISTRY_DIR_ENV] = str(tmp_path / "registry")
    out[registry.STATE_DIR_ENV] = str(tmp_path / "state")
    return out


def test_keys_create_on_a_live_auto_fleet(tmp_path: Path, env: dict[str, str]) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(ENDPOINT_FLEET)
    state = tmp_path / "state"
    up = _cli("up", str(fleet), "--detach", "--gateway-port", "0", cwd=tmp_path, env=env)
    assert up.returncode == 0, up.stderr
    try:
        token_file = state / "admin_token"
        token = token_file.read_text().strip()
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert f"console admin token: {token}" in up.stdout  # printed once, by `up`
        url = json.loads(_cli("status", "--json", cwd=tmp_path, env=env).stdout)[
            "gateway"]["url"]
        assert httpx.get(url + "/ui/api/fleet").status_code == 200  # auth off: open

        refused = _cli("keys", "create", "team-a", cwd=tmp_path, env=env)
        assert refused.returncode == 2  # before: created, and auth silently went on
        assert "turns auth ON" in refused.stderr and "--enable-auth" in refused.stderr
        listed = _cli("keys", "list", "--json", cwd=tmp_path, env=env)
        assert json.loads(listed.stdout)["keys"] == []

        created = _cli("keys", "create", "team-a", "--enable-auth", cwd=tmp_path, env=env)
        assert created.returncode == 0, created.stderr
        assert "auth is now ON at " + url in created.stderr
        assert f"admin token in {token_file}" in created.stderr

        deadline = time.monotonic() + 15
        while True:  # the gateway's refresh (2 s) turns it on; status says so then
            shown = json.loads(_cli("status", "--json", cwd=tmp_path, env=env).stdout)
            if shown["tenancy"]["auth_required"] or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert shown["tenancy"]["auth_required"] is True  # before: false until a restart
        assert shown["tenancy"]["admin_token_file"] == str(token_file)
        plain = _cli("status", cwd=tmp_path, env=env).stdout
        assert "auth: ON" in plain and f"admin token in {token_file}" in plain
        assert httpx.get(url + "/v1/models").status_code == 401
        console = httpx.get(url + "/ui/api/fleet", headers={"Authorization": f"Bearer {token}"})
        assert console.status_code == 200  # before: 403 until a restart with a token
        assert httpx.get(url + "/ui/api/fleet").status_code == 401

        first = _cli("down", cwd=tmp_path, env=env)
        assert first.returncode == 0 and "fleet stopped" in first.stdout, first.stderr
        second = _cli("down", cwd=tmp_path, env=env)
        assert second.returncode == 0 and "already stopped" in second.stdout
    finally:
        _cli("down", "--force", cwd=tmp_path, env=env)


def test_a_set_admin_token_wins_and_no_file_is_kept(tmp_path: Path) -> None:
    from inferplane.cli.up import _console_token
    from inferplane.spec.loader import parse_fleet

    spec = parse_fleet(ENDPOINT_FLEET, filename=str(tmp_path / "f.yaml"))
    token = _console_token(spec, tmp_path, True)
    assert token and (tmp_path / "admin_token").read_text().strip() == token
    os.environ["INFERPLANE_ADMIN_TOKEN"] = "set-by-me"
    try:
        assert _console_token(spec, tmp_path, True) is None
    finally:
        del os.environ["INFERPLANE_ADMIN_TOKEN"]
    assert not (tmp_path / "admin_token").exists()
    assert _console_token(spec, tmp_path, False) is None  # --no-tenancy: no console auth


def test_a_generated_token_is_in_force_exactly_while_auth_is() -> None:
    tenancy = Tenancy(None, auth="auto")
    tenancy.generated_admin_token = "gen"
    assert tenancy.admin_token is None  # auth off: the console stays open as before
    tenancy.keys_ever = 1
    assert tenancy.admin_token == "gen"
    tenancy.admin_token = "explicit"
    assert tenancy.admin_token == "explicit"
