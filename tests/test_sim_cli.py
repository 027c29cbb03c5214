"""`inferplane sim` flags reach the simulated engine's config (vLLM's names and defaults)."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

import inferplane.cli.sim as sim_cli
from inferplane.cli.main import app
from inferplane.engines.sim.config import SimEngineConfig


def _configs(monkeypatch: pytest.MonkeyPatch, *args: str) -> list[SimEngineConfig]:
    seen: list[SimEngineConfig] = []

    async def fake_serve(configs: list[SimEngineConfig], exit_on_crash: bool) -> int:
        seen.extend(configs)
        return 0

    monkeypatch.setattr(sim_cli, "_serve", fake_serve)
    result = CliRunner().invoke(app, ["sim", *args])
    assert result.exit_code == 0, result.output
    return seen


def test_logprob_and_tool_choice_flags_reach_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    default: Any = _configs(monkeypatch)[0]
    assert default.max_logprobs == 20 and default.enable_auto_tool_choice is False
    config: Any = _configs(monkeypatch, "--max-logprobs", "5", "--enable-auto-tool-choice")[0]
    assert config.max_logprobs == 5 and config.enable_auto_tool_choice is True
