"""`inferplane sim` flags reach the simulated engine's config (vLLM's names and defaults);
`--runner` decides the task as vLLM's does."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from planner_fleets import ROOT
from typer.testing import CliRunner

import inferplane.cli.sim as sim_cli
from inferplane.cli.main import app
from inferplane.errors import InferplaneError
from inferplane.runtime.instances import plan_sim_instances, plan_simulated
from inferplane.sim.build import build_parts
from inferplane.sim.config import SimEngineConfig
from inferplane.sim.fake_vllm import parse_serve_args
from inferplane.sim.host import EngineHost
from inferplane.spec import load_fleet

DEMO = ROOT / "examples" / "demo.yaml"


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
    config: Any = _configs(monkeypatch, "--max-logprobs", "5", "--enable-auto-tool-choice",
                           "--tool-call-parser", "hermes")[0]
    assert config.max_logprobs == 5 and config.enable_auto_tool_choice is True
    assert config.tool_call_parser == "hermes"


def test_runner_flag_reaches_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    config: Any = _configs(monkeypatch, "--runner", "pooling")[0]
    assert config.runner == "pooling"


def test_runner_pooling_serves_embeddings_from_a_generative_checkpoint() -> None:
    """vLLM's --runner overrides the task the checkpoint implies, so a fleet's `task: embed`
    is served as embeddings whatever the model's name or architecture suggests."""
    with EngineHost([SimEngineConfig(model="plain-name", runner="pooling")]) as handles:
        url = handles[0].url
        r = httpx.post(url + "/v1/embeddings", json={"model": "plain-name", "input": "hi"})
        assert r.status_code == 200 and r.json()["data"][0]["embedding"]
        chat = {"model": "plain-name", "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(url + "/v1/chat/completions", json=chat).status_code >= 400
    with pytest.raises(InferplaneError, match="runner"):
        build_parts(SimEngineConfig(model="m", runner="pool"))


def test_fleet_embed_models_run_as_pooling_runners() -> None:
    spec = load_fleet(DEMO)
    plan = plan_simulated(spec, None, str(DEMO))
    ports = iter(range(20000, 20100)).__next__
    for inst in plan_sim_instances(spec, plan=plan, port_picker=ports):
        model = spec.model(inst.model)
        assert model is not None
        embed = model.task == "embed"
        assert ("--runner" in inst.argv) == embed
        if embed:
            assert inst.argv[inst.argv.index("--runner") + 1] == "pooling"


def test_fake_vllm_reads_runner_and_the_old_task_flag() -> None:
    new, _ = parse_serve_args(["serve", "m", "--runner", "pooling"])
    old, _ = parse_serve_args(["serve", "m", "--task", "embed"])
    plain, _ = parse_serve_args(["serve", "m"])
    assert (new.runner, old.runner, plain.runner) == ("pooling", "pooling", "auto")


def test_the_engine_log_has_vllms_memory_lines(tmp_path: Any) -> None:
    """The first lines users grep a vLLM log for (issue 28): the KV cache size and the
    concurrency, in vLLM's format, before the engine says it listens."""
    import re
    import subprocess
    import sys

    process = subprocess.Popen(
        [sys.executable, "-m", "inferplane", "sim", "--model", "m", "--port", "0",
         "--max-model-len", "4096", "--gpu", "L4"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    lines: list[str] = []
    try:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if "listening on" in line:
                break
    finally:
        process.kill()
        process.wait(timeout=10)
    log = "".join(lines)
    match = re.search(r"\[kv_cache_utils\.py:\d+\] GPU KV cache size: ([\d,]+) tokens, Maximum "
                      r"concurrency for 4,096 tokens per request: ([\d.]+)x", log)
    assert match is not None, log
    tokens = int(match.group(1).replace(",", ""))
    assert float(match.group(2)) == pytest.approx(tokens / 4096, abs=0.01)
    assert "Using max model len 4096" in log and "Available KV cache memory:" in log


def test_kv_cache_memory_bytes_reads_vllms_human_readable_sizes() -> None:
    from inferplane.sim.fake_vllm import human_readable_int

    assert human_readable_int("64M") == 64 * 2**20 and human_readable_int("1G") == 2**30
    assert human_readable_int("1g") == 10**9 and human_readable_int("1048576") == 2**20
    config, ignored = parse_serve_args(["serve", "m", "--kv-cache-memory-bytes", "64M"])
    assert config.kv_cache_memory_bytes == 64 * 2**20 and ignored == []
