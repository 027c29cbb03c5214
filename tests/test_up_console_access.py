"""`up` and `status` say who may open the console next to its URL: with an admin token set
a newcomer otherwise met a sign-in form the output never mentioned (found bringing the demo
up with $INFERPLANE_ADMIN_TOKEN exported)."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from inferplane.cli.up import print_status


def _console_line(tenancy: dict[str, Any] | None) -> str:
    status = {"instances": [], "phase": "running", "tenancy": tenancy,
              "gateway": {"url": "http://127.0.0.1:8000", "console": True}}  # fmt: skip
    out = io.StringIO()
    print_status(status, Console(file=out, width=200))
    (line,) = [ln for ln in out.getvalue().splitlines() if ln.startswith("console:")]
    return line


@pytest.mark.parametrize(("admin", "auth", "expected"), [
    (True, False, "console: http://127.0.0.1:8000/ui (sign in with the admin token, "
                  "$MY_ADMIN)"),
    (False, True, "console: http://127.0.0.1:8000/ui (refused until $MY_ADMIN is set: auth "
                  "is on)"),
    (False, False, "console: http://127.0.0.1:8000/ui"),  # open, as the gateway is
])  # fmt: skip
def test_the_console_line_says_who_may_open_it(admin: bool, auth: bool, expected: str) -> None:
    tenancy = {"auth": "auto", "auth_required": auth, "database": "sqlite://",
               "admin_token": admin, "admin_token_env": "MY_ADMIN"}  # fmt: skip
    assert _console_line(tenancy) == expected


def test_no_tenancy_or_an_older_state_file_prints_the_url_alone() -> None:
    assert _console_line(None) == "console: http://127.0.0.1:8000/ui"
    older = {"auth": "on", "auth_required": True, "database": "sqlite://"}
    assert _console_line(older) == "console: http://127.0.0.1:8000/ui"


def test_the_runtime_status_says_whether_an_admin_token_is_set(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from inferplane.runtime import Runtime, RuntimeOptions
    from inferplane.spec import load_fleet

    monkeypatch.setenv("INFERPLANE_ADMIN_TOKEN", "s3cret")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("engine: sim\nmodels:\n  - name: chat\n    source: Qwen/Qwen3-0.6B\n")
    runtime = Runtime(load_fleet(fleet), RuntimeOptions(state_dir=tmp_path / "s"))
    tenancy = runtime.status()["tenancy"]
    assert tenancy["admin_token"] is True and tenancy["admin_token_env"] == "INFERPLANE_ADMIN_TOKEN"
    assert "s3cret" not in str(runtime.status())  # never the token itself
