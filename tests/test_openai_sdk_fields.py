"""The official `openai` SDK, through the real gateway, against simulated engines: every
request field of issue 18.7 either works (checked for what it means) or gets vLLM's exact
400 as `openai.BadRequestError`."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest
from model_factory import embed_model_dir
from openai.types.chat import ChatCompletionMessageFunctionToolCall
from test_gateway_fakes import Harness, harness  # noqa: F401
from test_sim_fields import SCHEMA, TOOLS

from inferplane.gateway import GatewayConfig, ModelRoute
from inferplane.sim.config import SimEngineConfig
from inferplane.sim.host import EngineHost

MESSAGES: list[Any] = [{"role": "user", "content": "hello"}]
WEATHER = TOOLS[1]["function"]["parameters"]


@pytest.fixture(scope="module")
def client(harness: Harness, tmp_path_factory: pytest.TempPathFactory  # noqa: F811
           ) -> Iterator[openai.OpenAI]:
    base = tmp_path_factory.mktemp("sdk-models")
    configs = [
        SimEngineConfig(model="chat", max_model_len=2048, eos_after_tokens=6,
                        tool_call_parser="hermes"),
        SimEngineConfig(model="emb", model_dir=embed_model_dir(base / "plain")),
        SimEngineConfig(model="mrl", model_dir=embed_model_dir(base / "mrl", is_matryoshka=True)),
    ]
    with EngineHost(configs) as handles:
        routes = tuple(ModelRoute(h.engine.model_name, endpoints=(h.url,)) for h in handles)
        _, url = harness.gateway(GatewayConfig(models=routes, access_log=False))
        with openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
            yield sdk


def _bad_request(call: Any) -> str:
    with pytest.raises(openai.BadRequestError) as caught:
        call()
    assert caught.value.status_code == 400
    body = caught.value.body
    assert isinstance(body, dict)
    return str(body["message"])


def test_chat_logprobs_and_their_limit(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=4,
                                           logprobs=True, top_logprobs=3)
    choice = reply.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    content = choice.logprobs.content
    assert "".join(t.token for t in content) == choice.message.content
    for token in content:
        assert token.logprob <= 0 and token.bytes == list(token.token.encode())
        assert token.top_logprobs[0].token == token.token
        assert len(token.top_logprobs) == 3
        assert sum(math.exp(t.logprob) for t in token.top_logprobs) <= 1
    stream = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=3,
                                            logprobs=True, top_logprobs=1, stream=True)
    streamed = [c.choices[0].logprobs.content[0].token for c in stream
                if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.content]
    assert len(streamed) == 3
    message = _bad_request(lambda: client.chat.completions.create(
        model="chat", messages=MESSAGES, logprobs=True, top_logprobs=21))
    assert message == ("Requested sample logprobs of 21, which is greater than max allowed: "
                       "20 (parameter=logprobs, value=21)")


def test_completion_logprobs(client: openai.OpenAI) -> None:
    reply = client.completions.create(model="chat", prompt="say", max_tokens=3, logprobs=2)
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None
    assert "".join(logprobs.tokens) == reply.choices[0].text
    assert logprobs.token_logprobs is not None and all(v <= 0 for v in logprobs.token_logprobs)
    assert logprobs.top_logprobs is not None and [len(t) for t in logprobs.top_logprobs] == [2] * 3
    assert logprobs.text_offset == [0, 3, 10]  # "sim", " filler", " token"
    message = _bad_request(lambda: client.completions.create(model="chat", prompt="x",
                                                              logprobs=30))
    assert message.startswith("Requested sample logprobs of 30, which is greater than max")


def test_response_format(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(model="chat", messages=MESSAGES,
                                           response_format={"type": "json_object"})
    assert isinstance(json.loads(plain.choices[0].message.content or ""), dict)
    typed = client.chat.completions.create(
        model="chat", messages=MESSAGES,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}})
    jsonschema.validate(json.loads(typed.choices[0].message.content or ""), SCHEMA)
    message = _bad_request(lambda: client.chat.completions.create(
        model="chat", messages=MESSAGES, response_format={
            "type": "json_schema",
            "json_schema": {"name": "p", "schema": {"type": "string", "pattern": "^x+$"}}}))
    assert message == "The provided JSON schema contains features not supported by xgrammar."


def test_tools(client: openai.OpenAI) -> None:
    named = client.chat.completions.create(
        model="chat", messages=MESSAGES, tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    calls = named.choices[0].message.tool_calls
    assert calls and isinstance(calls[0], ChatCompletionMessageFunctionToolCall)
    assert calls[0].function.name == "get_weather"
    jsonschema.validate(json.loads(calls[0].function.arguments), WEATHER)
    assert named.choices[0].finish_reason == "stop"  # vLLM: named tool choice ends "stop"
    required = client.chat.completions.create(model="chat", messages=MESSAGES,
                                              tools=[TOOLS[1]], tool_choice="required")
    calls = required.choices[0].message.tool_calls
    assert calls and isinstance(calls[0], ChatCompletionMessageFunctionToolCall)
    assert required.choices[0].finish_reason == "tool_calls"
    jsonschema.validate(json.loads(calls[0].function.arguments), WEATHER)
    message = _bad_request(lambda: client.chat.completions.create(
        model="chat", messages=MESSAGES, tools=TOOLS, tool_choice="auto"))
    assert message == ('"auto" tool choice requires --enable-auto-tool-choice and '
                       "--tool-call-parser to be set")


def test_echo_n_and_prompt_lists(client: openai.OpenAI) -> None:
    echoed = client.completions.create(model="chat", prompt="Once", echo=True, max_tokens=2)
    assert echoed.choices[0].text == "Oncesim filler"
    several = client.chat.completions.create(model="chat", messages=MESSAGES, n=3, max_tokens=2)
    assert [c.index for c in several.choices] == [0, 1, 2]
    assert several.usage is not None and several.usage.completion_tokens == 6
    stream = client.chat.completions.create(model="chat", messages=MESSAGES, n=2, max_tokens=2,
                                            stream=True)
    texts: dict[int, str] = {}
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
    assert sorted(texts) == [0, 1] and all(texts.values())
    batch = client.completions.create(model="chat", prompt=["one", "two three"], max_tokens=1)
    assert [c.index for c in batch.choices] == [0, 1]
    ids = client.completions.create(model="chat", prompt=[[1, 2], [3, 4, 5]], max_tokens=1, n=2)
    assert [c.index for c in ids.choices] == [0, 1, 2, 3]
    assert ids.usage is not None and ids.usage.prompt_tokens == 5


def test_embedding_dimensions(client: openai.OpenAI) -> None:
    short = client.embeddings.create(model="mrl", input=["a b", "c"], dimensions=64)
    assert [len(d.embedding) for d in short.data] == [64, 64]
    message = _bad_request(lambda: client.embeddings.create(model="emb", input="a",
                                                            dimensions=64))
    assert message == ("Model 'emb' does not support Matryoshka embeddings; dimensions must "
                       "be unset (received dimensions=64).")
