"""The running fleet is found from any shell (issue 18, item 5): `--state-dir`,
`$INFERPLANE_STATE_DIR`, `./.inferplane` when it runs, else the per-user registry; `keys`
and `usage` open the running fleet's database; `inferplane logs gateway`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferplane.errors import InferplaneError
from inferplane.runtime import registry
from inferplane.runtime.state import StateDir

ENDPOINT_FLEET = 'models:\n  - name: m\n    endpoints: ["http://127.0.0.1:9"]\n'


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A registry of our own, no $INFERPLANE_STATE_DIR, and a cwd with no .inferplane."""
    monkeypatch.setenv(registry.REGISTRY_DIR_ENV, str(tmp_path / "registry"))
    monkeypatch.delenv(registry.STATE_DIR_ENV, raising=False)
    monkeypatch.delenv("INFERPLANE_DATABASE_URL", raising=False)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return tmp_path


@pytest.fixture
def owner() -> Iterator[int]:
    """A live process that looks like an `inferplane up` (its argv names inferplane)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "inferplane"])
    yield proc.pid
    proc.kill()
    proc.wait()


def _running(path: Path, pid: int) -> StateDir:
    state = StateDir(path.resolve())
    state.path.mkdir(parents=True)
    state.pid_file.write_text(f"{pid}\n")
    registry.register(state, pid)
    return state


def test_resolution_order(isolated: Path, owner: int, monkeypatch: pytest.MonkeyPatch) -> None:
    local = StateDir((Path.cwd() / ".inferplane").resolve())
    assert registry.find_state_dir().path == local.path  # nothing runs: ./.inferplane
    one = _running(isolated / "one", owner)
    assert registry.find_state_dir().path == one.path  # the only running fleet
    assert registry.find_state_dir(isolated / "x").path == (isolated / "x").resolve()
    monkeypatch.setenv(registry.STATE_DIR_ENV, str(isolated / "y"))
    assert registry.find_state_dir().path == (isolated / "y").resolve()
    assert registry.up_state_dir().path == (isolated / "y").resolve()
    monkeypatch.delenv(registry.STATE_DIR_ENV)
    two = _running(isolated / "two", owner)
    with pytest.raises(InferplaneError) as err:
        registry.find_state_dir()
    assert str(one.path) in str(err.value) and str(two.path) in str(err.value)
    assert "--state-dir" in str(err.value)
    running_here = _running(Path.cwd() / ".inferplane", owner)
    assert registry.find_state_dir().path == running_here.path  # ./.inferplane runs: it


def test_stale_entries_are_ignored_and_removed(isolated: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass", "inferplane"])
    dead.wait()
    _running(isolated / "dead", dead.pid)
    assert registry.running_fleets() == []
    assert list((isolated / "registry").glob("*.json")) == []


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inferplane", *args], capture_output=True, text=True,
        timeout=60, cwd=cwd, env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"},
    )  # fmt: skip


def test_status_logs_keys_usage_down_from_another_directory(isolated: Path) -> None:
    fleet = isolated / "fleet.yaml"
    fleet.write_text(ENDPOINT_FLEET)
    state = isolated / "state"
    here, there = isolated / "elsewhere", isolated / "somewhere-else"
    there.mkdir()
    started = _cli("up", str(fleet), "--detach", "--state-dir", str(state),
                   "--gateway-port", "0", cwd=here)  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        shown = _cli("status", "--json", cwd=there)
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["log_dir"] == str((state / "logs").resolve())
        gateway_log = _cli("logs", "gateway", cwd=there)
        assert gateway_log.returncode == 0, gateway_log.stderr
        assert "gateway on http://127.0.0.1:" in gateway_log.stdout
        created = _cli("keys", "create", "team-a", "--json", "--enable-auth", cwd=there)
        assert created.returncode == 0, created.stderr
        key_id = json.loads(created.stdout)["id"]
        direct = _cli("keys", "list", "--json", "--db", f"sqlite:///{state / 'inferplane.db'}",
                      cwd=there)  # fmt: skip
        assert key_id in direct.stdout  # the running fleet's database, not ./.inferplane
        assert _cli("usage", "--json", cwd=there).returncode == 0
        assert not (there / ".inferplane").exists() and not (here / ".inferplane").exists()
        stopped = _cli("down", cwd=there)
        assert stopped.returncode == 0, stopped.stderr
        assert "fleet stopped" in stopped.stdout
    finally:
        _cli("down", "--state-dir", str(state), "--force", cwd=here)
    assert registry.running_fleets() == []
    assert "gateway stopped" in (state / "logs" / "gateway.log").read_text()


def test_keys_db_from_a_file(isolated: Path) -> None:
    from inferplane.cli.keys import resolve_db

    url_file = isolated / "db-url"
    url_file.write_text(f"sqlite:///{isolated / 'k.db'}\n")
    assert resolve_db(f"@{url_file}", None).endswith(str(isolated / "k.db"))
