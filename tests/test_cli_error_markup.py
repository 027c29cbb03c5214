"""The CLI prints an error's text as text: `pip install 'inferplane[tracing]'` in a fix kept
its "[tracing]" (Rich took it for markup and dropped it; found starting a fleet with
gateway.tracing on a fresh clone, without the tracing extra)."""

from __future__ import annotations

import pytest

from inferplane.cli import main as cli_main
from inferplane.errors import USAGE_EXIT_CODE, InferplaneError


def test_brackets_in_an_error_survive(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fail() -> None:
        raise InferplaneError("tracing needs OpenTelemetry", field="gateway.tracing",
                              value="http://[::1]:4318",
                              fix="pip install 'inferplane[tracing]'")  # fmt: skip

    monkeypatch.setattr(cli_main, "_register_commands", lambda: None)
    monkeypatch.setattr(cli_main, "app", fail)
    with pytest.raises(SystemExit) as exit_info:
        cli_main.main()
    assert exit_info.value.code == USAGE_EXIT_CODE
    err = capsys.readouterr().err
    assert "pip install 'inferplane[tracing]'" in err
    assert "http://[::1]:4318" in err and err.startswith("error: gateway.tracing:")
