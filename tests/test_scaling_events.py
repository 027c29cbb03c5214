"""`inferplane events`: the decision log a fleet writes, read from another shell."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from inferplane.cli.main import _register_commands, app
from inferplane.scaling.events import EVENTS_FILE, EventLog, read_events


def test_events_are_appended_and_listed_with_their_reasons(tmp_path: Path) -> None:
    log = EventLog(tmp_path / EVENTS_FILE, keep=2)
    log.add("chat", "scale_up", "7 waiting per replica (target 5) for 120 s", 1, 2, "chat-1")
    log.add("embed", "sleep", "idle for 600 s", 1, 0, "embed-0")
    log.add("chat", "scale_down", "idle for 600 s", 2, 1, "chat-1")
    assert [e["kind"] for e in log.recent()] == ["sleep", "scale_down"]  # memory keeps 2
    with (tmp_path / EVENTS_FILE).open("a") as f:
        f.write('{"torn')  # a writer cut short: skipped
    assert len(read_events(tmp_path)) == 3
    assert (tmp_path / EVENTS_FILE).stat().st_mode & 0o777 == 0o600
    _register_commands()
    runner = CliRunner()
    out = runner.invoke(app, ["events", "--state-dir", str(tmp_path), "--model", "chat",
                              "--json"])
    assert out.exit_code == 0, out.output
    events = json.loads(out.output)["events"]
    assert [e["kind"] for e in events] == ["scale_up", "scale_down"]
    assert events[0]["reason"].startswith("7 waiting per replica")
    table = runner.invoke(app, ["events", "--state-dir", str(tmp_path), "--last", "1"])
    assert table.exit_code == 0 and "scale_down" in table.output and "2 -> 1" in table.output
