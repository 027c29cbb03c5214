"""Issue 19.6: no credential in what the tool prints, in `ps` (the database URL can come from
a file), in engine environments; state files private."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest
from test_gateway_failures import dead_url
from test_gateway_fakes import Harness, http

from inferplane.gateway import GatewayConfig, ModelRoute
from inferplane.gateway.redact import redact_url
from inferplane.runtime.process import RotatingLog, spawn
from inferplane.runtime.state import StateDir
from inferplane.store import Store
from inferplane.tenancy.service import Tenancy
from inferplane.tenancy.wiring import tenancy_database_url

PG = "postgresql+asyncpg://app:hunter2@db.internal:5432/inferplane"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (PG, "postgresql+asyncpg://app:***@db.internal:5432/inferplane"),
        ("redis://:hunter2@cache:6379/0", "redis://:***@cache:6379/0"),
        ("postgresql://app@db/x?password=hunter2&sslmode=require",
         "postgresql://***@db/x?password=***&sslmode=require"),
        ("sqlite:////var/lib/inferplane.db", "sqlite:////var/lib/inferplane.db"),
        ("http://127.0.0.1:8001", "http://127.0.0.1:8001"),
    ],
)  # fmt: skip
def test_urls_are_shown_without_credentials(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_the_startup_banner_hides_the_database_password() -> None:
    tenancy = Tenancy(Store(PG), auth="auto")
    line = tenancy.describe()
    assert "hunter2" not in line and "app:***@db.internal" in line


def test_the_database_url_can_come_from_a_file_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "db-url"
    secret.write_text(PG + "\n")
    assert tenancy_database_url(None, f"@{secret}") == PG  # `--db @FILE`: ps shows the path
    monkeypatch.delenv("INFERPLANE_DATABASE_URL", raising=False)
    monkeypatch.setenv("INFERPLANE_DATABASE_URL_FILE", str(secret))
    assert tenancy_database_url(None, None) == PG


async def test_engines_do_not_inherit_the_gateways_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INFERPLANE_ADMIN_TOKEN", "admin-hunter2")
    monkeypatch.setenv("INFERPLANE_DATABASE_URL", PG)
    monkeypatch.setenv("MY_FLEET_ADMIN", "custom-hunter2")
    monkeypatch.setenv("HF_TOKEN", "hf-needed-by-vllm")
    log = RotatingLog(tmp_path / "engine.log")
    code = "import os; print(sorted(os.environ.items()))"
    proc = await spawn([sys.executable, "-c", code], {"ENGINE_OWN": "1"}, log,
                       hidden={"MY_FLEET_ADMIN"})  # fmt: skip
    assert await proc.wait() == 0
    log.close()
    text = (tmp_path / "engine.log").read_text()
    assert "hunter2" not in text
    assert "hf-needed-by-vllm" in text and "ENGINE_OWN" in text
    assert stat.S_IMODE((tmp_path / "engine.log").stat().st_mode) == 0o600


def test_state_files_are_private(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "state")
    state.claim()
    state.write({"phase": "running"})
    assert stat.S_IMODE(state.path.stat().st_mode) == 0o700
    assert stat.S_IMODE(state.log_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(state.state_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(state.pid_file.stat().st_mode) == 0o600
    state.release()


def test_replica_credentials_never_reach_clients_or_metrics() -> None:
    h = Harness()
    try:
        url = dead_url().replace("http://", "http://user:hunter2@")
        config = GatewayConfig(models=(ModelRoute("m", endpoints=(url,)),), access_log=False)
        _, gw = h.gateway(config)
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
        r = http.post(gw + "/v1/chat/completions", json=body)
        assert r.status_code == 502 and "hunter2" not in r.text
        assert "user" not in r.text and "m-endpoint-0" in r.text  # no address at all (issue 30)
        assert "hunter2" not in http.get(gw + "/metrics").text
    finally:
        h.close()
