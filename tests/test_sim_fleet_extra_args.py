"""An `engine: sim` fleet's `extra_args` that vLLM's request validation reads reach the
simulated engine: `enable-auto-tool-choice` (else every OpenAI SDK call with `tools` is
vLLM's 400) and `max-logprobs` (found trying the SDK's tools call against the demo)."""

from __future__ import annotations

from pathlib import Path

from inferplane.cli.sim import sim
from inferplane.runtime.instances import sim_argv
from inferplane.spec import ModelSpec, load_fleet


def _model(tmp_path: Path, extra: str) -> ModelSpec:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("engine: sim\nmodels:\n  - name: chat\n    source: Qwen/Qwen3-0.6B\n"
                     f"    extra_args: {extra}\n")  # fmt: skip
    return load_fleet(fleet).models[0]


def test_tool_choice_and_logprobs_flags_reach_the_simulated_engine(tmp_path: Path) -> None:
    model = _model(tmp_path, "{enable-auto-tool-choice: true, tool-call-parser: hermes, "
                             "max_logprobs: 5, enable-prefix-caching: true}")
    argv = sim_argv(model, port=1, gpu="L40S")
    tail = argv[argv.index("--gpu") + 2:]
    assert "--enable-auto-tool-choice" in tail
    assert tail[tail.index("--max-logprobs") + 1] == "5"
    # the parser reaches it too (vLLM refuses forced tool calls without one)
    assert tail[tail.index("--tool-call-parser") + 1] == "hermes"
    # flags the simulator does not model are not passed (it would refuse them)
    assert not any("prefix-caching" in a for a in tail)
    off = sim_argv(_model(tmp_path, "{enable-auto-tool-choice: false}"), port=1, gpu="L40S")
    assert "--no-enable-auto-tool-choice" in off


def test_the_simulators_cli_takes_the_flags_sim_argv_passes() -> None:
    import typer

    app = typer.Typer()
    app.command()(sim)
    command = typer.main.get_command(app)
    flags = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
    assert {"--max-logprobs", "--enable-auto-tool-choice", "--no-enable-auto-tool-choice",
            "--tool-call-parser"} <= flags
