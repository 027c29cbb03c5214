"""Rough edges of the first hour (issue 28): what the CLI prints for capacity at 80
columns, `down` of a stopped fleet, `status` of a stopped fleet, `estimate` with an
invalid TP, and a fleet whose `source` is missing or a Hugging Face id."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.cells import cell_len
from typer.testing import CliRunner

from inferplane.cli.main import _register_commands, app
from inferplane.errors import InferplaneError

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "inferplane" / "bench" / "examples"
MODELS = REPO / "tests" / "data" / "models"


@pytest.fixture
def runner() -> CliRunner:
    _register_commands()
    return CliRunner()


def test_capacity_fits_80_columns_and_keeps_the_answer(runner: CliRunner) -> None:
    result = runner.invoke(app, [
        "capacity", str(EXAMPLES / "s2-rag-7b.yaml"), "--traffic",
        str(EXAMPLES / "s2-traffic.yaml"), "--gpus", "H100", "--requests", "60",
    ])  # a pipe: 80 columns (before: a 124-column table, or `H10…` in a terminal)
    assert result.exit_code == 0, result.output
    table = [line for line in result.stdout.splitlines() if line[:1] in "┏┃┡│└"]
    assert table and max(cell_len(line) for line in table) <= 80, "\n".join(table)
    assert "H100-SXM-80GB" in result.stdout and "$/h" in result.stdout


def test_down_of_a_stopped_fleet_is_success(runner: CliRunner, tmp_path: Path) -> None:
    for state in (tmp_path / "never-created", tmp_path):
        result = runner.invoke(app, ["down", "--state-dir", str(state)])
        assert result.exit_code == 0, result.output
        assert "already stopped" in result.output


def test_status_of_a_stopped_fleet_offers_no_url(runner: CliRunner, tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text(json.dumps({
        "pid": 999999999, "phase": "running", "started_at": 1.0,
        "gateway": {"url": "http://127.0.0.1:18123", "in_flight": 0, "console": True},
        "instances": [{"name": "m-0", "model": "m", "state": "ready", "pid": 999999999,
                       "port": 18124, "url": "http://127.0.0.1:18124", "gpus": [],
                       "restarts": 0}],
        "endpoint_models": [], "tenancy": None,
    }))
    result = runner.invoke(app, ["status", "--state-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "fleet (stopped)" in result.output
    assert "gateway: not running" in result.output
    assert "/ui" not in result.output and "console:" not in result.output


def test_estimate_with_an_invalid_tp_prints_only_the_error(runner: CliRunner) -> None:
    result = runner.invoke(app, ["estimate", str(MODELS / "Qwen--Qwen3-8B"), "--gpu", "H100",
                                 "-tp", "3"])
    assert result.exit_code == 2
    assert "tensor_parallel_size 3 does not divide" in result.output
    assert "KV cache tokens" not in result.output and "max concurrency" not in result.output


@pytest.mark.parametrize("source", ["Qwen/Qwen3-8B", "./no-such-model"])
def test_a_missing_source_names_the_model_and_the_field(
    runner: CliRunner, tmp_path: Path, source: str
) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("gpus: {nodes: [{name: n, gpu_type: H100, count: 1}]}\n"
                     f"models:\n  - {{name: chat, source: {source}}}\n")
    result = runner.invoke(app, ["plan", str(fleet), "--time-limit-s", "0"])
    assert isinstance(result.exception, InferplaneError)  # main() turns it into exit 2
    text = result.exception.render()  # before: "PATH: model path does not exist"
    assert "models.chat.source" in text and source.removeprefix("./") in text
    if not source.startswith("."):
        assert "not a local directory" in text
        assert f"huggingface-cli download {source} config.json" in text


def test_ctrl_c_during_up_detach_stops_the_starting_fleet(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal
    import subprocess
    import sys

    import psutil

    from inferplane.runtime import control

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    monkeypatch.setattr(control, "spawn_detached", lambda argv, state, env=None: child.pid)

    handlers = []

    def interrupted(*args: object, **kwargs: object) -> dict[str, object]:
        handlers.append(signal.getsignal(signal.SIGINT))
        raise KeyboardInterrupt  # Ctrl-C while the detached fleet is still starting

    monkeypatch.setattr(control, "wait_detached_ready", interrupted)
    # what the planner's CP-SAT solve leaves behind: Ctrl-C would kill `up` outright
    previous = signal.signal(signal.SIGINT, signal.SIG_DFL)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text('models:\n  - name: m\n    endpoints: ["http://127.0.0.1:9"]\n')
    result = runner.invoke(app, ["up", str(fleet), "--detach", "--state-dir",
                                 str(tmp_path / "state"), "--gateway-port", "0"])
    signal.signal(signal.SIGINT, previous)
    try:
        assert handlers == [signal.default_int_handler]  # a KeyboardInterrupt, not death
        assert result.exit_code == 130, result.output
        assert "interrupted: stopping the fleet starting in the background" in result.output
        assert "fleet stopped" in result.output
        assert not psutil.pid_exists(child.pid)  # before: it went on starting, unsaid
    finally:
        if psutil.pid_exists(child.pid):
            child.kill()


def test_multi_node_fleets_keep_the_node(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from inferplane.cli.plan import print_plan
    from inferplane.cli.up import print_status
    from inferplane.planner.build import plan_fleet
    from inferplane.runtime.labels import gpus_label
    from inferplane.spec.loader import parse_fleet

    plan = plan_fleet(parse_fleet(
        "engine: sim\n"
        "gpus: {nodes: [{name: node-a, gpu_type: H100, count: 8}, "
        "{name: node-b, gpu_type: H100, count: 8}]}\n"
        f"models:\n  - {{name: llama-3.1-70b, source: "
        f"{MODELS / 'meta-llama--Llama-3.1-70B-Instruct'}, tensor_parallel_size: 8, "
        "replicas: 2, max_model_len: 4096}\n",
        filename=str(tmp_path / "f.yaml")), time_limit_s=0)
    out = io.StringIO()
    print_plan(plan, Console(file=out, width=80, color_system=None))
    rows = [line for line in out.getvalue().splitlines() if line.startswith("│ llama")]
    assert {("node-a" in r, "node-b" in r) for r in rows[-2:]} == {(True, False), (False, True)}

    instances = [{"name": f"m-{i}", "model": "m", "state": "ready", "pid": 1, "port": 1,
                  "restarts": 0, "gpus": [4, 5, 6, 7], "node": n}
                 for i, n in enumerate(("node-a", "node-b"))]
    assert [gpus_label(i, instances) for i in instances] == ["node-a:4,5,6,7",
                                                             "node-b:4,5,6,7"]
    assert gpus_label(instances[0], instances[:1]) == "4,5,6,7"  # one node: as before
    out = io.StringIO()
    print_status({"phase": "running", "gateway": {"url": "http://127.0.0.1:1"},
                  "instances": instances}, Console(file=out, width=80, color_system=None))
    assert "node-b:4,5,6,7" in out.getvalue()


def test_warnings_print_names_without_highlighting() -> None:
    import io

    from rich.console import Console

    from inferplane.cli.plan import print_plan
    from inferplane.planner.build import plan_fleet
    from inferplane.spec import load_fleet

    plan = plan_fleet(load_fleet(REPO / "examples" / "demo-sim.yaml"), time_limit_s=0)
    plan.warnings.append("qwen3-embedding-0.6b-0: P09 something about 0.9")
    out = io.StringIO()  # a terminal with colour, and Rich's highlighter on by default
    print_plan(plan, Console(file=out, force_terminal=True, color_system="standard",
                             width=200))
    line = next(x for x in out.getvalue().splitlines() if "P09 something" in x)
    assert "qwen3-embedding-0.6b-0: P09 something about 0.9" in line, repr(line)


def test_help_is_reflowed_one_entry_per_command_and_flags_untyped() -> None:
    import os

    from inferplane.cli.help_text import first_sentence, reflow

    assert reflow("A wrapped\n    sentence.\n\n    Next.") == "A wrapped sentence.\n\nNext."
    assert first_sentence("Do X (P33). Then Y.") == "Do X (P33)."
    _register_commands()
    env = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb"}
    listing = CliRunner().invoke(app, ["--help"], env=env).output
    lines = listing.splitlines()
    lint = next(i for i, line in enumerate(lines) if "│ lint " in line)
    assert lines[lint + 1].startswith("│ doctor ")  # one line (before: 9)
    assert "<bool>" not in listing
    estimate = CliRunner().invoke(app, ["estimate", "--help"], env=env).output
    assert "<bool>" not in estimate and "<int>" in estimate  # valued options keep theirs


def test_gpu_names_ambiguous_nearest_and_a800() -> None:
    from pydantic_core import PydanticCustomError

    from inferplane.gpus import lookup_gpu
    from inferplane.spec.gpu_names import canonical_gpu_type

    with pytest.raises(InferplaneError) as err:  # before: silently the SXM card
        lookup_gpu("H100-80GB")
    assert "H100-SXM-80GB or H100-PCIE-80GB" in err.value.render()
    with pytest.raises(PydanticCustomError) as bad:  # the fleet file: the nearest names
        canonical_gpu_type("H100-80G")
    fix = str((bad.value.context or {})["fix"])
    assert "did you mean H100-SXM-80GB or H100-PCIE-80GB" in fix and "e.g. L40S" not in fix
    assert lookup_gpu("NVIDIA A800-SXM4-80GB").name == "A800-SXM-80GB"
    assert (lookup_gpu("A800").interconnect_bandwidth_gbps
            < lookup_gpu("A100").interconnect_bandwidth_gbps)


def test_small_words(runner: CliRunner, tmp_path: Path) -> None:
    from inferplane.spec.loader import parse_fleet
    from inferplane.spec.problems import FleetValidationError

    with pytest.raises(FleetValidationError) as bad:
        parse_fleet('models:\n  - name: m\n    endpoints: ["http://127.0.0.1:9"]\n'
                    "    max_model_len: 8k\n", filename="f.yaml")
    assert "8192" in str(bad.value) and "e.g. 2" not in str(bad.value)
    with pytest.raises(FleetValidationError) as mixed:
        parse_fleet(
            'models:\n  - {name: chat, endpoints: ["http://127.0.0.1:9"]}\n'
            '  - {name: emb, task: embed, endpoints: ["http://127.0.0.1:8"]}\n'
            "routes:\n  - {model: chat, backends: [{target: emb, weight: 1}]}\n",
            filename="f.yaml")
    assert "is an embed model" in str(mixed.value) and "a embed" not in str(mixed.value)

    state = tmp_path / "state"
    (state / "logs").mkdir(parents=True)
    names = ["llama-3.1-70b-0", "llama-3.1-70b-1", "qwen3-8b-0"]
    for name in names:
        (state / "logs" / f"{name}.log").write_text("x\n")
    (state / "state.json").write_text(json.dumps(
        {"instances": [{"name": n} for n in names]}))
    result = runner.invoke(app, ["logs", "llama-70b-0", "--state-dir", str(state)])
    assert isinstance(result.exception, InferplaneError)
    assert "did you mean llama-3.1-70b-0?" in result.exception.render()
    assert "qwen3-8b-0" not in result.exception.render()  # before: every instance listed
