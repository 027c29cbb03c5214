"""The simulator held to real vLLM itself (the CPU build of 0.32.0, tiny local models).

One module-scoped recording: a chat engine (tiny-llama with the hermes tool parser and
xgrammar without whitespace) and a pooling engine (tiny-qwen3, `--runner pooling`) start
together on cores 0 and 1, every case of `vllm_contract.CASES` runs against them, then a
plain chat engine (no tool flags) replaces the pooling one for the cases that need it. The
same command lines start simulated engines. Checked:

- real vLLM still answers as tests/data/vllm_contract/recording.json says (the default
  suite compares the simulator against that file); `INFERPLANE_RECORD_CONTRACT=1` rewrites
  it and the tiny models' config/tokenizer files next to it instead of comparing;
- every difference between live vLLM and the simulator is explained in docs/simulator.md;
- both engines log the KV cache line in one format with the same numbers.

A third phase starts the plain engine and a LoRA engine (`--enable-lora`, the tiny adapters
of scripts/make_tiny_adapter.py, VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) together for the
`lora_*` and `plain_*` cases: adapter cards, chats to an adapter, runtime load/unload and
vLLM's refusals.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import vllm_contract as vc
from real_vllm import RealEngine, start_vllm

RECORD = os.environ.get("INFERPLANE_RECORD_CONTRACT") == "1"
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json",
               "tokenizer_config.json", "chat_template.jinja")


def _start(venv: Path, models: dict[str, Path], kind: str, logs: Path, cores: str,
           adapters: Path | None = None) -> RealEngine:
    return start_vllm(venv, models[vc.ENGINE_MODELS[kind]], vc.SERVED[kind], logs / kind,
                      cores=cores, max_model_len=vc.MAX_MODEL_LEN,
                      extra_args=vc.engine_args(kind, adapters), wait=False,
                      env=vc.ENGINE_ENV.get(kind))


def _warm_up(engine: RealEngine) -> None:
    """The first logprobs / grammar request of an engine stalls for seconds (research note):
    pay it before the recording so no case runs into a client timeout."""
    import httpx

    body = {"model": vc.CHAT_NAME, "prompt": "hi", "max_tokens": 2, "logprobs": 1}
    with httpx.Client(timeout=120) as client:
        client.post(engine.url + "/v1/completions", json=body)
        client.post(engine.url + "/v1/completions", json={
            **body, "response_format": {"type": "json_object"}})


@pytest.fixture(scope="module")
def live(vllm_venv: Path, tiny_models: dict[str, Path],
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    logs = tmp_path_factory.mktemp("contract-engines")
    engines: list[RealEngine] = []
    try:
        chat = _start(vllm_venv, tiny_models, vc.CHAT, logs, "0")
        engines.append(chat)
        embed = _start(vllm_venv, tiny_models, vc.EMBED, logs, "1")
        engines.append(embed)
        chat.wait_ready()
        embed.wait_ready()
        _warm_up(chat)
        urls = {vc.CHAT: chat.url, vc.EMBED: embed.url}
        cases = vc.record(urls)
        metrics = vc.record_metrics(urls)
        embed.stop()
        chat.stop()
        # the plain and the LoRA engine together, one core each
        adapters = vc.make_adapters(tmp_path_factory.mktemp("contract-adapters"),
                                    tiny_models["tiny-llama"])
        plain = _start(vllm_venv, tiny_models, vc.PLAIN, logs, "1")
        engines.append(plain)
        lora = _start(vllm_venv, tiny_models, vc.LORA, logs, "0", adapters)
        engines.append(lora)
        plain.wait_ready()
        lora.wait_ready()
        urls = {vc.PLAIN: plain.url, vc.LORA: lora.url}
        cases.update(vc.record(urls, adapters=adapters))
        metrics.update(vc.record_metrics(urls))
        startup = {vc.CHAT: vc.kv_line(chat.log_text()), vc.EMBED: vc.kv_line(embed.log_text())}
        yield {"vllm_version": vc_version(vllm_venv), "cases": dict(sorted(cases.items())),
               "metrics": metrics, "startup": startup,
               "logs": {e.name + "@" + str(e.port): e.log_text() for e in engines}}
    finally:
        for engine in engines:
            engine.stop()


def vc_version(venv: Path) -> str:
    """The vLLM version of the venv (its dist-info shim says `0.32.0+cpu`)."""
    shims = sorted(venv.glob("lib/python*/site-packages/vllm-*+cpu.dist-info"))
    return shims[0].name.split("-")[1].split("+")[0] if shims else "unknown"


def test_real_vllm_answers_as_recorded(live: dict[str, Any],
                                       tiny_models: dict[str, Path]) -> None:
    recording = {k: live[k] for k in ("vllm_version", "cases", "metrics", "startup")}
    if RECORD:
        vc.save_recording(recording)
        for name in ("tiny-llama", "tiny-qwen3"):
            target = vc.RECORDING.parent / "models" / name
            target.mkdir(parents=True, exist_ok=True)
            for file in MODEL_FILES:
                if (tiny_models[name] / file).is_file():
                    shutil.copyfile(tiny_models[name] / file, target / file)
        return
    committed = vc.load_recording()
    assert vc.differences(committed, recording) == [], (
        "real vLLM no longer answers as tests/data/vllm_contract/recording.json says; "
        "re-record with INFERPLANE_RECORD_CONTRACT=1 and review the diff")
    assert committed["startup"] == recording["startup"]


def test_simulator_matches_live_vllm(live: dict[str, Any], tiny_models: dict[str, Path],
                                     tmp_path: Path) -> None:
    adapters = vc.make_adapters(tmp_path / "adapters", tiny_models["tiny-llama"])
    simulated = vc.record_simulator(tiny_models, adapters)
    diffs = vc.differences(live, simulated)
    missing, stale = vc.unexplained(diffs, vc.explained())
    assert missing == [], "differences docs/simulator.md's contract table does not explain"
    assert stale == []


def test_both_log_the_kv_cache_line_alike(live: dict[str, Any],
                                          tiny_models: dict[str, Path]) -> None:
    from inferplane.sim.build import build_parts
    from inferplane.sim.fake_vllm import parse_serve_args
    from inferplane.sim.startup_log import startup_lines

    real = live["startup"][vc.CHAT]
    assert real is not None, "real vLLM logged no KV cache line"
    config, _ = parse_serve_args(vc.serve_argv(vc.CHAT, tiny_models["tiny-llama"], 0))
    sim = vc.kv_line("\n".join(startup_lines(build_parts(config), pid=1)))
    assert sim is not None
    assert {k: v for k, v in sim.items() if k != "device"} == {
        k: v for k, v in real.items() if k != "device"}
