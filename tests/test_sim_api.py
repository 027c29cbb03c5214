"""The simulated engine's HTTP surface, through the real `openai` client and httpx."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from model_factory import embed_model_dir
from prometheus_client.parser import text_string_to_metric_families

from inferplane.sim.config import FaultConfig, SimEngineConfig
from inferplane.sim.host import EngineHandle, EngineHost, start_engine, start_engines


@pytest.fixture(scope="module")
def engine() -> Iterator[EngineHandle]:
    config = SimEngineConfig(model="sim-chat", max_model_len=2048, eos_after_tokens=40)
    with EngineHost([config]) as handles:
        yield handles[0]


@pytest.fixture(scope="module")
def client(engine: EngineHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=engine.url + "/v1", api_key="unused", max_retries=0)


def _metrics(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model_name") == "sim-chat" and "le" not in sample.labels:
                key = sample.name
                if "finished_reason" in sample.labels:
                    key += ":" + sample.labels["finished_reason"]
                values[key] = sample.value
    return values


def test_chat_non_streaming(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="sim-chat", messages=[{"role": "user", "content": "hello"}], max_tokens=7,
    )
    assert reply.usage is not None and reply.usage.completion_tokens == 7
    assert reply.choices[0].finish_reason == "length"
    assert reply.choices[0].message.content == "sim filler token lorem ipsum dolor sit"


def test_chat_streaming_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="sim-chat", messages=[{"role": "user", "content": "hi"}],
        max_completion_tokens=5, stream=True, stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "sim filler token lorem ipsum"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_completions_stop_and_eos(client: openai.OpenAI) -> None:
    stopped = client.completions.create(
        model="sim-chat", prompt="x", max_tokens=50, stop=[" lorem"]
    )
    assert stopped.choices[0].text == "sim filler token"
    assert stopped.choices[0].finish_reason == "stop"
    natural = client.completions.create(model="sim-chat", prompt="x", max_tokens=100)
    assert natural.usage is not None and natural.usage.completion_tokens == 40
    assert natural.choices[0].finish_reason == "stop"
    forced = client.completions.create(
        model="sim-chat", prompt="x", max_tokens=60, extra_body={"ignore_eos": True}
    )
    assert forced.usage is not None and forced.usage.completion_tokens == 60


async def test_async_client_streaming_completion(engine: EngineHandle) -> None:
    aclient = openai.AsyncOpenAI(base_url=engine.url + "/v1", api_key="x", max_retries=0)
    stream = await aclient.completions.create(
        model="sim-chat", prompt="abc", max_tokens=4, stream=True
    )
    pieces = [chunk.choices[0].text async for chunk in stream]
    assert "".join(pieces) == "sim filler token lorem"
    await aclient.close()


def test_models_health_and_errors(engine: EngineHandle, client: openai.OpenAI) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == ["sim-chat"]
    assert models[0].model_extra is not None and models[0].model_extra["max_model_len"] == 2048
    health = httpx.get(engine.url + "/health")
    assert health.status_code == 200 and health.content == b""
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    response = httpx.post(engine.url + "/v1/completions", json={
        "model": "sim-chat", "prompt": "word " * 3000, "max_tokens": 10,
    })
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == 400 and error["type"] == "BadRequestError"
    assert "maximum context length is 2048" in error["message"]
    bad = httpx.post(engine.url + "/v1/chat/completions", json={
        "model": "sim-chat", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1,
    })
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"


def test_sleep_and_wake(engine: EngineHandle) -> None:
    assert httpx.post(engine.url + "/sleep").status_code == 200
    assert httpx.get(engine.url + "/is_sleeping").json() == {"is_sleeping": True}
    refused = httpx.post(engine.url + "/v1/completions", json={"model": "sim-chat", "prompt": "x"})
    assert refused.status_code == 400
    assert httpx.post(engine.url + "/wake_up").status_code == 200
    assert httpx.get(engine.url + "/is_sleeping").json() == {"is_sleeping": False}


async def test_metrics_move_under_load_and_count_prefix_hits() -> None:
    # A small KV pool (low utilization on a small card) so load reaches it quickly.
    config = SimEngineConfig(
        model="sim-chat", gpu="T4", gpu_memory_utilization=0.2, max_model_len=1024,
        max_num_seqs=256, max_num_batched_tokens=1024, faults=FaultConfig(slowdown=4),
    )
    handle = await start_engine(config)
    shared = "system prompt " * 100
    try:
        async with httpx.AsyncClient(base_url=handle.url, timeout=60) as http:
            async def one(i: int) -> None:
                await http.post("/v1/completions", json={
                    "model": "sim-chat", "prompt": shared + f" question {i}", "max_tokens": 64,
                    "ignore_eos": True,
                })

            tasks = [asyncio.create_task(one(i)) for i in range(40)]
            peak_waiting = peak_kv = 0.0
            while not all(t.done() for t in tasks):
                values = await asyncio.to_thread(_metrics, handle.url)
                peak_waiting = max(peak_waiting, values["vllm:num_requests_waiting"])
                peak_kv = max(peak_kv, values["vllm:kv_cache_usage_perc"])
                await asyncio.sleep(0.05)
            await asyncio.gather(*tasks)
        values = await asyncio.to_thread(_metrics, handle.url)
    finally:
        await handle.stop()
    assert peak_waiting > 0 and peak_kv > 0.3
    assert values["vllm:request_success_total:length"] == 40
    assert values["vllm:generation_tokens_total"] == 40 * 64
    assert values["vllm:prefix_cache_hits_total"] > 0
    assert values["vllm:prefix_cache_queries_total"] >= values["vllm:prefix_cache_hits_total"]
    assert values["vllm:time_to_first_token_seconds_count"] == 40
    assert values["vllm:inter_token_latency_seconds_count"] == 40 * 63
    assert values["vllm:num_requests_running"] == 0


def test_embeddings_for_embed_models(tmp_path: Path) -> None:
    # Sentence-transformers layout marks an embedding checkpoint (vLLM: task embed).
    config = SimEngineConfig(model="emb", model_dir=embed_model_dir(tmp_path))
    with EngineHost([config]) as handles:
        parts = handles[0].engine.parts
        if parts.profile.default_task != "embed":
            pytest.skip("the model loader does not mark this directory as an embedding model")
        client = openai.OpenAI(base_url=handles[0].url + "/v1", api_key="x", max_retries=0)
        result = client.embeddings.create(model="emb", input=["a b c", "d e"])
        assert [len(d.embedding) for d in result.data] == [1024, 1024]
        assert result.usage.prompt_tokens > 0
        again = client.embeddings.create(model="emb", input="a b c", encoding_format="float")
        assert again.data[0].embedding == pytest.approx(result.data[0].embedding, abs=1e-6)


async def test_faults_load_time_fail_rate_crash_hang() -> None:
    loading, failing, crashing, hanging = await start_engines([
        SimEngineConfig(model="m", max_model_len=1024, faults=FaultConfig(load_time_s=30)),
        SimEngineConfig(model="m", max_model_len=1024, faults=FaultConfig(fail_rate=1.0)),
        SimEngineConfig(model="m", max_model_len=1024,
                        faults=FaultConfig(crash_after_requests=1)),
        SimEngineConfig(model="m", max_model_len=1024, faults=FaultConfig(hang_after_requests=1)),
    ])
    body = {"model": "m", "prompt": "x", "max_tokens": 2}
    try:
        async with httpx.AsyncClient(timeout=5) as http:
            assert (await http.get(loading.url + "/health")).status_code == 503
            assert (await http.post(failing.url + "/v1/completions", json=body)).status_code == 500
            assert (await http.post(crashing.url + "/v1/completions", json=body)).status_code == 200
            await http.post(crashing.url + "/v1/completions", json=body)
            await asyncio.wait_for(crashing.crashed.wait(), 5)
            assert (await http.post(hanging.url + "/v1/completions", json=body)).status_code == 200
            with pytest.raises(httpx.ReadTimeout):
                await http.get(hanging.url + "/health", timeout=0.3)
        await asyncio.sleep(0.2)
        with pytest.raises(httpx.ConnectError):
            async with httpx.AsyncClient(timeout=2) as http:
                await http.get(crashing.url + "/health")
    finally:
        for handle in (loading, failing, hanging, crashing):
            await handle.stop()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
def test_non_streamed_request_aborts_when_its_client_disconnects(path: str) -> None:
    # vLLM's with_cancellation: a client gone mid-generation frees its slot at once.
    faults = FaultConfig(slowdown=50.0)  # ~2000 tokens at 50x: minutes if it kept running
    config = SimEngineConfig(model="sim-chat", max_model_len=2048, faults=faults)
    with EngineHost([config]) as handles:
        url = handles[0].url
        body: dict[str, object] = {
            "model": "sim-chat", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2000, "ignore_eos": True,
        }
        if path == "/v1/responses":
            body = {"model": "sim-chat", "input": "hi", "max_output_tokens": 2000,
                    "ignore_eos": True}
        timeout = httpx.Timeout(10.0, read=1.0)
        with httpx.Client(timeout=timeout) as http, pytest.raises(httpx.ReadTimeout):
            http.post(url + path, json=body)  # closed on the timeout
        seen: dict[str, float] = {}
        for _ in range(200):  # poll: the abort lands within a few scheduler steps
            seen = _metrics(url)
            if seen.get("vllm:num_requests_running") == 0:
                break
            asyncio.run(asyncio.sleep(0.05))
        assert seen.get("vllm:num_requests_running") == 0
        assert seen.get("vllm:request_success_total:abort") == 1
