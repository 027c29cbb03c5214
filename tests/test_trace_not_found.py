"""`inferplane trace` when there is nothing to find says what it searched and how to fix
the call, without repeating the id as "got" or calling the search list a fix; a state
directory that does not exist is named as the problem (found trying `trace nosuchid`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferplane.cli.main import _register_commands, app
from inferplane.errors import InferplaneError


def _trace(*args: str) -> InferplaneError:
    _register_commands()
    result = CliRunner().invoke(app, ["trace", *args])
    assert isinstance(result.exception, InferplaneError), result.output
    return result.exception


def test_an_unknown_id_lists_the_files_searched_and_a_real_fix(tmp_path: Path) -> None:
    logs = tmp_path / "state" / "logs"
    logs.mkdir(parents=True)
    (logs / "gateway-access.log").write_text('{"request_id": "other"}\n')
    (logs / "chat-0.log").write_text("INFO Received request chatcmpl-other: ...\n")
    error = _trace("nosuchid", "--state-dir", str(tmp_path / "state"))
    text = error.render()
    assert "request id 'nosuchid' is not in the fleet's logs (searched " in text
    assert str(logs / "gateway-access.log") in error.message
    assert str(logs / "chat-0.log") in error.message
    assert error.value is None and "got" not in text  # the id is said once
    assert error.fix is not None and "x-request-id" in error.fix and "--state-dir" in error.fix


def test_a_state_dir_that_does_not_exist_is_the_error(tmp_path: Path) -> None:
    error = _trace("any", "--state-dir", str(tmp_path / "typo"))
    assert error.field == "--state-dir" and error.value == str((tmp_path / "typo").resolve())
    assert "no fleet has run from this state directory" in error.message


def test_the_header_names_an_endpoint_once_and_a_gateway_answer_as_such(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from inferplane.cli.trace import _print

    base = {"status": 502, "events": [], "prompt_tokens": 0, "completion_tokens": 0}
    requests = [
        {**base, "model": "chat", "replica": "http://127.0.0.1:5", "instance": "chat-0"},
        {**base, "model": "ext", "replica": "http://127.0.0.1:9", "instance": "http://127.0.0.1:9"},
        {**base, "model": "-", "replica": "-", "instance": "-"},
    ]
    _print({"request_id": "r", "requests": requests, "engine_log": [], "usage": []})
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("request")]
    assert "replica chat-0 (http://127.0.0.1:5)" in lines[0]
    assert "replica http://127.0.0.1:9," in lines[1] and "(http://127.0.0.1:9)" not in lines[1]
    assert "no replica (the gateway answered itself)" in lines[2]
