"""LoRA on the simulated engine: vLLM 0.32's adapter endpoints, refusals, `/v1/models`
cards, the `--max-loras` batch limit and the `--max-cpu-loras` host cache."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from inferplane.errors import InferplaneError
from inferplane.sim.config import SimEngineConfig
from inferplane.sim.fake_vllm import parse_serve_args
from inferplane.sim.host import EngineHandle, EngineHost, start_engine
from inferplane.sim.lora import lora_config
from inferplane.sim.scheduler import Scheduler, SimRequest

RUNTIME = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


def _adapter(root: Path, name: str, rank: int = 8) -> str:
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text(json.dumps({
        "r": rank, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"],
        "base_model_name_or_path": "base", "bias": "none", "peft_type": "LORA",
    }))
    (path / "adapter_model.safetensors").write_bytes(b"\0" * 64)
    return str(path)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("adapters")
    for name in ("sql", "support", "extra"):
        _adapter(root, name)
    _adapter(root, "wide", rank=64)
    return root


@pytest.fixture(scope="module")
def engine(adapters: Path) -> Iterator[EngineHandle]:
    lora = lora_config(True, max_loras=1, max_lora_rank=16,
                       modules=[f"sql={adapters / 'sql'}"], load_time_s=0.0, env=RUNTIME)
    config = SimEngineConfig(model="base", max_model_len=2048, lora=lora)
    with EngineHost([config]) as handles:
        yield handles[0]


def _chat(url: str, model: str) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", json={
        "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})


def test_static_adapter_listed_with_parent_and_answers_by_name(
    engine: EngineHandle, adapters: Path
) -> None:
    cards = httpx.get(engine.url + "/v1/models").json()["data"]
    by_id = {card["id"]: card for card in cards}
    assert by_id["base"]["parent"] is None
    assert by_id["sql"]["parent"] == "base"
    assert by_id["sql"]["root"] == str(adapters / "sql")
    reply = _chat(engine.url, "sql")
    assert reply.status_code == 200 and reply.json()["model"] == "sql"


def test_unknown_model_is_vllms_404(engine: EngineHandle) -> None:
    reply = _chat(engine.url, "nope")
    assert reply.status_code == 404
    assert reply.json()["error"] == {
        "message": "The model `nope` does not exist. Valid aliases: base.",
        "type": "NotFoundError", "param": "model", "code": 404}


def test_runtime_load_unload_and_vllms_refusals(engine: EngineHandle, adapters: Path) -> None:
    load, unload = engine.url + "/v1/load_lora_adapter", engine.url + "/v1/unload_lora_adapter"
    support = str(adapters / "support")
    ok = httpx.post(load, json={"lora_name": "support", "lora_path": support})
    assert ok.status_code == 200
    assert ok.text == "Success: LoRA adapter 'support' added successfully."
    assert _chat(engine.url, "support").json()["model"] == "support"
    again = httpx.post(load, json={"lora_name": "support", "lora_path": support})
    assert again.status_code == 400 and "has already been loaded" in again.text
    base = httpx.post(load, json={"lora_name": "base", "lora_path": support})
    assert base.json()["error"]["message"] == (
        "The lora adapter 'base' conflicts with a served base model.")
    wide = httpx.post(load, json={"lora_name": "wide", "lora_path": str(adapters / "wide")})
    assert wide.status_code == 500
    assert wide.json()["error"]["message"] == (
        "Call to add_lora method failed: LoRA rank 64 is greater than max_lora_rank 16.")
    missing = httpx.post(load, json={"lora_name": "gone", "lora_path": "/no/such/dir"})
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == (
        "Loading lora gone failed: No adapter found for /no/such/dir")
    assert httpx.post(unload, json={"lora_name": "support"}).status_code == 200
    assert _chat(engine.url, "support").status_code == 404
    gone = httpx.post(unload, json={"lora_name": "support"})
    assert gone.status_code == 404
    assert gone.json()["error"]["message"] == "The lora adapter 'support' cannot be found."


def test_load_endpoint_absent_without_runtime_variable(adapters: Path) -> None:
    lora = lora_config(True, modules=[], env={})
    with EngineHost([SimEngineConfig(model="base", max_model_len=1024, lora=lora)]) as hs:
        reply = httpx.post(hs[0].url + "/v1/load_lora_adapter",
                           json={"lora_name": "x", "lora_path": str(adapters / "sql")})
    assert reply.status_code == 404 and reply.json() == {"detail": "Not Found"}


def test_static_adapter_above_max_rank_stops_the_start(adapters: Path) -> None:
    lora = lora_config(True, max_lora_rank=16, modules=[f"wide={adapters / 'wide'}"])

    async def start() -> None:
        handle = await start_engine(SimEngineConfig(model="base", max_model_len=1024, lora=lora))
        await handle.stop()

    with pytest.raises(InferplaneError, match="LoRA rank 64 is greater than max_lora_rank 16"):
        asyncio.run(start())


def test_fake_vllm_reads_the_lora_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "true")
    config, ignored = parse_serve_args([
        "serve", "m", "--enable-lora", "--max-loras", "2", "--max-lora-rank", "32",
        "--max-cpu-loras", "4", "--lora-modules", "a=/x/a", '{"name": "b", "path": "/x/b"}',
    ])
    assert config.lora is not None and not ignored
    assert (config.lora.max_loras, config.lora.max_lora_rank, config.lora.cpu_slots) == (2, 32, 4)
    assert config.lora.modules == (("a", "/x/a"), ("b", "/x/b"))
    assert config.lora.runtime_updates
    with pytest.raises(InferplaneError, match=r"max_cpu_loras \(1\) must be >= max_loras \(2\)"):
        lora_config(True, max_loras=2, max_cpu_loras=1)


def _request(rid: str, lora: str | None) -> SimRequest:
    return SimRequest(rid, list(range(16)), 4, "length", 0.0, lora=lora)


def test_a_batch_mixes_at_most_max_loras_adapters() -> None:
    scheduler = Scheduler(num_blocks=400, block_size=16, max_num_seqs=16,
                          max_num_batched_tokens=4096, max_loras=2)
    for i, lora in enumerate(["a", "b", "c", "a", None, "c"]):
        scheduler.add(_request(f"r{i}", lora))
    scheduler.schedule(0.0)
    running = [r.lora for r in scheduler.running]
    assert running == ["a", "b", "a", None]  # "c" waits: two adapters are in the batch
    assert [r.request_id for r in scheduler.waiting] == ["r2", "r5"]  # order kept


def test_evicted_adapter_is_read_again_once(adapters: Path) -> None:
    lora = lora_config(True, max_loras=1, max_cpu_loras=1, load_time_s=0.0,
                       modules=[f"sql={adapters / 'sql'}", f"support={adapters / 'support'}"])

    async def run() -> tuple[int, int]:
        handle = await start_engine(SimEngineConfig(model="base", max_model_len=1024,
                                                    lora=lora))
        try:
            loras = handle.engine.loras
            sql = loras.get("sql")
            assert sql is not None
            await asyncio.gather(*(loras.activate(sql) for _ in range(5)))  # evicted by support
            await loras.activate(sql)  # now cached
            return loras.cache_misses, loras.disk_loads
        finally:
            await handle.stop()

    assert asyncio.run(run()) == (1, 3)


def test_lora_slots_come_out_of_the_kv_cache() -> None:
    from inferplane.sim.build import build_parts

    plain = build_parts(SimEngineConfig(model="base", max_model_len=2048))
    lora = build_parts(SimEngineConfig(model="base", max_model_len=2048,
                                       lora=lora_config(True, max_loras=4, max_lora_rank=64)))
    assert lora.memory.lora_gib > 0
    assert lora.memory.num_gpu_blocks < plain.memory.num_gpu_blocks
    assert lora.memory.kv_cache_gib < plain.memory.kv_cache_gib - lora.memory.lora_gib * 0.99


def test_sim_fleet_file_takes_a_lora_block() -> None:
    from inferplane.cli.sim import _engine_from_mapping

    config = _engine_from_mapping(
        {"model": "m", "lora": {"max_loras": 2, "modules": ["a=/x/a"], "runtime_updates": True}},
        "f.yaml: engines[0]")
    assert config.lora is not None and config.lora.modules == (("a", "/x/a"),)
    with pytest.raises(InferplaneError, match="not a LoRA block"):
        _engine_from_mapping({"model": "m", "lora": {"slots": 2}}, "f.yaml: engines[0]")


def test_refusals_read_as_vllms_sanitized_and_executor_wrapped(adapters: Path) -> None:
    """Recorded from real vLLM (tests/data/vllm_contract, `lora_load_*`): error messages
    lose file paths (sanitize_message), and the multiprocess executor (TP > 1) wraps the
    worker's refusal of a rank above --max-lora-rank."""
    from inferplane.sim.lora import SimAdapters
    from inferplane.sim.protocol import ApiError, sanitize

    lora = lora_config(True, max_lora_rank=16, env=RUNTIME)
    gone = ApiError(404, f"Loading lora x failed: No adapter found for {adapters / 'nope'}")
    assert gone.body()["error"]["message"] == "Loading lora x failed: No adapter found for <path>"
    assert sanitize('boom <object at 0x7f3a>\n  File "/x/y.py", line 3, in f\n    g()') == (
        "boom <object>")
    assert sanitize("read /data/models/cfg.json") == "read <path>"
    for multiproc, words in ((False, "Call to add_lora method failed: LoRA rank 64 is "
                              "greater than max_lora_rank 16."),
                             (True, "Call to add_lora method failed: Worker failed with error "
                              "'LoRA rank 64 is greater than max_lora_rank 16.', please check "
                              "the stack trace above for the root cause")):
        registry = SimAdapters(lora, "base", multiproc=multiproc)
        with pytest.raises(ApiError) as refused:
            asyncio.run(registry.load({"lora_name": "wide",
                                       "lora_path": str(adapters / "wide")}))
        assert (refused.value.status, refused.value.message) == (500, words)
    validation = ApiError(400, "1 validation error: /tmp/x", error_type="Bad Request")
    assert validation.body()["error"]["message"] == "1 validation error: /tmp/x"  # as vLLM's
    for tp in (1, 2):  # the engine picks the executor from its tensor parallel size
        config = SimEngineConfig(model="base", max_model_len=1024, tensor_parallel_size=tp,
                                 lora=lora)
        with EngineHost([config]) as hosted:
            assert hosted[0].engine.loras.multiproc is (tp > 1)
