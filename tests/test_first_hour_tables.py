"""Tables at 80 columns (a pipe, a narrow terminal): no line is longer than 80 and no row
breaks over several lines; what is hidden is named (issue 18, item 4)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.cells import cell_len
from rich.console import Console
from typer.testing import CliRunner

from inferplane.cli.main import _register_commands, app
from inferplane.cli.tables import Col, fitted_table

REPO = Path(__file__).resolve().parent.parent
NAMES = ["qwen3-embedding-0.6b-0", "qwen3-embedding-0.6b-1", "qwen3-32b-fp8-0",
         "qwen3-32b-fp8-1", "qwen2.5-7b-instruct-0"]  # fmt: skip


def _console(width: int) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=width, force_terminal=False, color_system=None), out


def _assert_fits(text: str, width: int) -> None:
    """Every table line fits (messages are printed whole: paths and URLs never break)."""
    table = [line for line in text.splitlines() if line[:1] in "┏┃┡│└"]
    assert table
    too_long = [line for line in table if cell_len(line) > width]
    assert not too_long, "\n".join(too_long)


def _status() -> dict[str, object]:
    return {
        "phase": "running",
        "gateway": {"url": "http://127.0.0.1:8000", "in_flight": 0},
        "instances": [
            {"name": n, "model": n.rsplit("-", 1)[0], "state": "ready", "pid": 100000 + i,
             "port": 41000 + i, "gpus": [0, 1], "restarts": 0, "uptime_s": 3725.0,
             "waiting": 12, "running": 64, "kv_cache_usage": 0.42}
            for i, n in enumerate(NAMES)
        ],
        "endpoint_models": [{"model": "remote", "endpoints": ["http://10.0.0.7:8000"]}],
        "tenancy": {"database": "sqlite+aiosqlite:////a/long/path/to/the/state/dir/"
                                "inferplane.db", "auth": "auto", "auth_required": False},
    }


def test_status_table_at_80_columns_one_line_per_instance() -> None:
    from inferplane.cli.up import print_status

    console, out = _console(80)
    print_status(_status(), console)
    text = out.getvalue()
    _assert_fits(text, 80)
    for name in NAMES:
        assert sum(name in line for line in text.splitlines()) == 1, text
    assert "not shown at 80 columns: model" in text
    assert "│ ready " in text and "42%" in text  # state and load survive
    assert "sqlite+aiosqlite:////a/long/path/to/the/state/dir/inferplane.db" in text  # whole


def test_status_names_the_console_only_when_it_is_on() -> None:
    from inferplane.cli.up import print_status

    status = _status()
    for on in (True, False):
        status["gateway"] = {"url": "http://127.0.0.1:8000", "in_flight": 0, "console": on}
        console, out = _console(120)
        print_status(status, console)
        assert ("console: http://127.0.0.1:8000/ui" in out.getvalue()) is on


def test_status_table_wide_shows_every_column() -> None:
    from inferplane.cli.up import STATUS_COLUMNS, print_status

    console, out = _console(200)
    print_status(_status(), console)
    text = out.getvalue()
    assert all(col.header in text for col in STATUS_COLUMNS)
    assert "not shown" not in text


@pytest.mark.parametrize("fleet", ["examples/demo.yaml", "examples/s0-l40s-colocated.yaml"])
def test_plan_tables_at_80_columns(fleet: str) -> None:
    from inferplane.cli.plan import print_plan
    from inferplane.planner.build import plan_fleet
    from inferplane.spec import load_fleet

    plan = plan_fleet(load_fleet(REPO / fleet), time_limit_s=0)
    console, out = _console(80)
    print_plan(plan, console)
    text = out.getvalue()
    lines = text.splitlines()
    _assert_fits(text, 80)
    for inst in plan.instances:  # one line per instance in the instances table
        assert sum(line.startswith(f"│ {inst.id} ") for line in lines) == 1, text
    assert "GiB" in text and "used/budget" in text


def test_fitted_table_drops_the_highest_rank_first_and_keeps_rank_0() -> None:
    cols = [Col("name"), Col("a" * 30, drop=1), Col("b" * 30, drop=2), Col("c" * 30)]
    table = fitted_table(cols, [["x", "1", "2", "3"]], 80)
    assert [c.header for c in table.columns] == ["name", "a" * 30, "c" * 30]
    narrow = fitted_table(cols, [["x", "1", "2", "3"]], 20)
    assert [c.header for c in narrow.columns] == ["name", "c" * 30]  # rank 0 never dropped


def test_keys_list_at_80_columns(tmp_path: Path) -> None:
    _register_commands()
    db = f"sqlite:///{tmp_path / 'keys.db'}"
    runner = CliRunner()
    env = {"COLUMNS": "80", "NO_COLOR": "1"}
    for name in ("team-search-prod", "team-recommendations-batch"):
        created = runner.invoke(app, ["keys", "create", name, "--db", db, "--rpm", "600",
                                      "--tpm", "100000", "--budget-tokens", "1000000",
                                      "--models", "qwen3-32b-fp8,qwen2.5-7b-instruct"],
                                env=env)  # fmt: skip
        assert created.exit_code == 0, created.output
    listed = runner.invoke(app, ["keys", "list", "--db", db], env=env)
    assert listed.exit_code == 0, listed.output
    _assert_fits(listed.output, 80)
    assert sum("team-search-prod" in line for line in listed.output.splitlines()) == 1


def test_gpus_discover_at_80_columns_keeps_the_whole_uuid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from test_gpus_cli import _fake_host

    _fake_host(monkeypatch)
    _register_commands()
    result = CliRunner().invoke(app, ["gpus", "--discover"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    _assert_fits(result.output, 80)
    assert "GPU-aaaa" in result.output  # pins engines: never hidden or cut


def test_status_says_when_the_supervisor_cannot_check_an_instance() -> None:
    from inferplane.cli.up import print_status

    status = _status()
    first = status["instances"][0]  # type: ignore[index]
    first["check_error"] = "health: OSError: [Errno 24] Too many open files"
    console, out = _console(80)
    print_status(status, console)
    text = out.getvalue()
    _assert_fits(text, 80)
    assert "(unchecked)" in text
    assert f"{NAMES[0]}: the supervisor cannot check it: health: OSError" in text
