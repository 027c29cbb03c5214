"""The simulator answers the OpenAI fields clients send honestly, or refuses them as vLLM does
(issue 18.7): logprobs, response_format, tools, echo, n, prompt lists, embeddings dimensions,
plus `created`, unique ids and `vllm:prompt_tokens_total`."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest
from model_factory import embed_model_dir
from prometheus_client.parser import text_string_to_metric_families

from inferplane.errors import InferplaneError
from inferplane.sim.build import build_parts
from inferplane.sim.config import SimEngineConfig
from inferplane.sim.fake_vllm import parse_serve_args
from inferplane.sim.host import EngineHandle, EngineHost

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "user", "content": "hello there"}]
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 3},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 2},
        "kind": {"const": "person"},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": ["string", "null"]}},
            "required": ["city"],
        },
        "score": {"type": "number", "exclusiveMinimum": 0.5},
        "ref": {"$ref": "#/$defs/flag"},
    },
    "required": ["name", "age", "tags", "kind", "address"],
    "additionalProperties": False,
    "$defs": {"flag": {"type": "boolean"}},
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object"}}},
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"},
                           "unit": {"enum": ["c", "f"]},
                           "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "unit", "days"],
        },
    }},
]


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[EngineHandle]]:
    base = tmp_path_factory.mktemp("models")
    configs = [
        SimEngineConfig(model="m", max_model_len=2048, eos_after_tokens=6,
                        tool_call_parser="hermes"),
        SimEngineConfig(model="m", max_model_len=2048, eos_after_tokens=6,
                        enable_auto_tool_choice=True, tool_call_parser="hermes", max_logprobs=5),
        SimEngineConfig(model="emb", model_dir=embed_model_dir(base / "plain")),
        SimEngineConfig(model="mrl", model_dir=embed_model_dir(
            base / "mrl", matryoshka_dimensions=[256, 512, 1024])),
    ]
    with EngineHost(configs) as handles:
        yield handles


@pytest.fixture(scope="module")
def http(engines: list[EngineHandle]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=engines[0].url, timeout=20) as client:
        yield client


def _events(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.text
    lines = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def _error(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == 400
    return dict(error)


def _check_chat_logprob(item: dict[str, Any], k: int) -> None:
    assert item["logprob"] <= 0
    assert item["bytes"] == list(item["token"].encode())
    top = item["top_logprobs"]
    assert len(top) == k
    if k:
        assert top[0]["token"] == item["token"] and top[0]["logprob"] == item["logprob"]
        values = [t["logprob"] for t in top]
        assert values == sorted(values, reverse=True)
        assert len({t["token"] for t in top}) == k
        assert sum(math.exp(v) for v in values) <= 1.0


# -- logprobs ----------------------------------------------------------------------------


def test_chat_logprobs_have_vllms_shape(http: httpx.Client) -> None:
    reply = http.post(CHAT, json={"model": "m", "messages": MESSAGES, "logprobs": True,
                                  "top_logprobs": 4, "max_tokens": 5}).json()
    choice = reply["choices"][0]
    content = choice["logprobs"]["content"]
    assert "".join(item["token"] for item in content) == choice["message"]["content"]
    assert len(content) == reply["usage"]["completion_tokens"] == 5
    for item in content:
        _check_chat_logprob(item, 4)
    plain = http.post(CHAT, json={"model": "m", "messages": MESSAGES, "logprobs": True,
                                  "max_tokens": 2}).json()
    assert [item["top_logprobs"] for item in plain["choices"][0]["logprobs"]["content"]] == [
        [], []]


def test_chat_logprobs_stream_per_token(http: httpx.Client) -> None:
    events = _events(http.post(CHAT, json={
        "model": "m", "messages": MESSAGES, "logprobs": True, "top_logprobs": 2,
        "max_tokens": 3, "stream": True}))
    tokens = [e["choices"][0]["logprobs"]["content"] for e in events
              if e["choices"][0]["logprobs"]]
    assert [len(t) for t in tokens] == [1, 1, 1]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    assert "".join(t[0]["token"] for t in tokens) == text
    for t in tokens:
        _check_chat_logprob(t[0], 2)


def test_completion_logprobs_have_vllms_shape(http: httpx.Client) -> None:
    reply = http.post(COMPLETIONS, json={"model": "m", "prompt": "say", "logprobs": 3,
                                         "max_tokens": 4}).json()
    choice = reply["choices"][0]
    logprobs = choice["logprobs"]
    assert "".join(logprobs["tokens"]) == choice["text"]
    assert all(v <= 0 for v in logprobs["token_logprobs"])
    assert [len(top) for top in logprobs["top_logprobs"]] == [3, 3, 3, 3]
    for token, value, top in zip(logprobs["tokens"], logprobs["token_logprobs"],
                                 logprobs["top_logprobs"], strict=True):
        assert top[token] == value == max(top.values())
    offsets = [0]
    for token in logprobs["tokens"][:-1]:
        offsets.append(offsets[-1] + len(token))
    assert logprobs["text_offset"] == offsets
    zero = http.post(COMPLETIONS, json={"model": "m", "prompt": "say", "logprobs": 0,
                                        "max_tokens": 2}).json()
    assert [len(top) for top in zero["choices"][0]["logprobs"]["top_logprobs"]] == [1, 1]


def test_completion_logprobs_stream(http: httpx.Client) -> None:
    events = _events(http.post(COMPLETIONS, json={
        "model": "m", "prompt": "say", "logprobs": 1, "max_tokens": 3, "stream": True}))
    offsets = [e["choices"][0]["logprobs"]["text_offset"][0] for e in events]
    texts = [e["choices"][0]["text"] for e in events]
    assert offsets == [0, len(texts[0]), len(texts[0]) + len(texts[1])]


def test_logprobs_limits_are_vllms(engines: list[EngineHandle], http: httpx.Client) -> None:
    over = _error(http.post(CHAT, json={"model": "m", "messages": MESSAGES, "logprobs": True,
                                        "top_logprobs": 21}))
    assert over["message"] == ("Requested sample logprobs of 21, which is greater than max "
                               "allowed: 20 (parameter=logprobs, value=21)")
    assert over["type"] == "BadRequestError" and over["param"] == "logprobs"
    small = httpx.post(engines[1].url + COMPLETIONS, json={"model": "m", "prompt": "x",
                                                           "logprobs": 6})
    assert _error(small)["message"].startswith(
        "Requested sample logprobs of 6, which is greater than max allowed: 5")
    missing = _error(http.post(CHAT, json={"model": "m", "messages": MESSAGES,
                                           "top_logprobs": 2}))
    assert missing["type"] == "BadRequestError" and missing["param"] == "top_logprobs"
    assert "when using `top_logprobs`, `logprobs` must be set to true." in missing["message"]
    negative = _error(http.post(COMPLETIONS, json={"model": "m", "prompt": "x",
                                                   "logprobs": -3}))
    assert "`logprobs` must be a positive value or -1." in negative["message"]


# -- structured outputs ------------------------------------------------------------------


def test_json_object_parses(http: httpx.Client) -> None:
    reply = http.post(CHAT, json={"model": "m", "messages": MESSAGES,
                                  "response_format": {"type": "json_object"}}).json()
    assert isinstance(json.loads(reply["choices"][0]["message"]["content"]), dict)
    assert reply["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_output_validates(http: httpx.Client, stream: bool) -> None:
    body = {"model": "m", "messages": MESSAGES, "stream": stream, "response_format": {
        "type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}}
    response = http.post(CHAT, json=body)
    if stream:
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in _events(response))
    else:
        text = response.json()["choices"][0]["message"]["content"]
    jsonschema.validate(json.loads(text), SCHEMA)


def test_json_schema_on_completions_validates(http: httpx.Client) -> None:
    reply = http.post(COMPLETIONS, json={"model": "m", "prompt": "x", "response_format": {
        "type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}}).json()
    jsonschema.validate(json.loads(reply["choices"][0]["text"]), SCHEMA)


def test_json_cut_by_max_tokens_says_length(http: httpx.Client) -> None:
    reply = http.post(CHAT, json={"model": "m", "messages": MESSAGES, "max_tokens": 3,
                                  "response_format": {"type": "json_schema", "json_schema": {
                                      "name": "s", "schema": SCHEMA}}}).json()
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("schema", [
    {"type": "string", "pattern": "^[a-z]+$"},
    {"type": "object", "properties": {"a": {"not": {"type": "string"}}}, "required": ["a"]},
    {"type": "string", "format": "credit-card"},
])
def test_unsatisfiable_schema_gets_xgrammars_400(http: httpx.Client, schema: Any) -> None:
    error = _error(http.post(CHAT, json={"model": "m", "messages": MESSAGES, "response_format": {
        "type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}))
    assert error["message"] == (
        "The provided JSON schema contains features not supported by xgrammar.")
    assert error["type"] == "BadRequestError"


def test_json_schema_without_schema_field_is_vllms_validation_400(http: httpx.Client) -> None:
    error = _error(http.post(CHAT, json={"model": "m", "messages": MESSAGES,
                                         "response_format": {"type": "json_schema"}}))
    assert error["param"] == "response_format"
    assert "the 'json_schema' field must be provided." in error["message"]


# -- tools -------------------------------------------------------------------------------


def _weather_arguments(call: dict[str, Any]) -> None:
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert re.fullmatch(r"chatcmpl-tool-[0-9a-f]{32}", call["id"])
    jsonschema.validate(json.loads(call["function"]["arguments"]),
                        TOOLS[1]["function"]["parameters"])


def test_named_tool_choice_calls_it(http: httpx.Client) -> None:
    reply = http.post(CHAT, json={"model": "m", "messages": MESSAGES, "tools": TOOLS,
                                  "tool_choice": {"type": "function",
                                                  "function": {"name": "get_weather"}}}).json()
    choice = reply["choices"][0]
    _weather_arguments(choice["message"]["tool_calls"][0])
    assert choice["finish_reason"] == "stop"  # vLLM: "stop" for a named tool choice


def test_required_tool_choice_says_tool_calls(http: httpx.Client) -> None:
    tools = [TOOLS[1], TOOLS[0]]
    reply = http.post(CHAT, json={"model": "m", "messages": MESSAGES, "tools": tools,
                                  "tool_choice": "required"}).json()
    choice = reply["choices"][0]
    _weather_arguments(choice["message"]["tool_calls"][0])
    assert choice["finish_reason"] == "tool_calls"


def test_streamed_tool_call_assembles(http: httpx.Client) -> None:
    events = _events(http.post(CHAT, json={
        "model": "m", "messages": MESSAGES, "tools": TOOLS, "stream": True,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}))
    deltas = [e["choices"][0]["delta"]["tool_calls"][0] for e in events
              if e["choices"][0]["delta"].get("tool_calls")]
    first = deltas[0]
    call = {"id": first["id"], "type": first["type"], "function": {
        "name": first["function"]["name"],
        "arguments": "".join(d["function"].get("arguments", "") for d in deltas)}}
    _weather_arguments(call)
    assert events[-1]["choices"][0]["finish_reason"] == "stop"


def test_auto_tool_choice_needs_the_flag(engines: list[EngineHandle], http: httpx.Client) -> None:
    message = ('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
               "to be set")
    for body in ({"tools": TOOLS, "tool_choice": "auto"}, {"tools": TOOLS}):
        error = _error(http.post(CHAT, json={"model": "m", "messages": MESSAGES, **body}))
        assert error["message"] == message and error["type"] == "BadRequestError"
    enabled = httpx.post(engines[1].url + CHAT, json={"model": "m", "messages": MESSAGES,
                                                      "tools": TOOLS, "tool_choice": "auto"})
    assert enabled.status_code == 200
    assert enabled.json()["choices"][0]["message"]["content"]


def test_forced_tool_calls_need_a_tool_call_parser() -> None:
    """vLLM refuses tool_choice "required" or a named function without --tool-call-parser,
    and does not start with --enable-auto-tool-choice alone (issue 28: the parser given in
    extra_args must reach the simulator)."""
    named = {"type": "function", "function": {"name": "get_weather"}}
    with EngineHost([SimEngineConfig(model="m", eos_after_tokens=2)]) as handles:
        url = handles[0].url + CHAT
        for choice, words in (("required", 'tool_choice="required"'),
                              (named, 'tool_choice=function "get_weather"')):
            error = _error(httpx.post(url, json={"model": "m", "messages": MESSAGES,
                                                 "tools": TOOLS, "tool_choice": choice}))
            assert error["message"] == f"{words} requires --tool-call-parser to be set"
    with pytest.raises(InferplaneError, match="--enable-auto-tool-choice requires"):
        build_parts(SimEngineConfig(model="m", enable_auto_tool_choice=True))


def test_tool_choice_validation_is_vllms(http: httpx.Client) -> None:
    unknown = _error(http.post(CHAT, json={"model": "m", "messages": MESSAGES, "tools": TOOLS,
                                           "tool_choice": {"type": "function",
                                                           "function": {"name": "nope"}}}))
    assert unknown["param"] == "tool_choice" and unknown["type"] == "BadRequestError"
    assert "The tool specified in `tool_choice` does not match any of the specified `tools`" in (
        unknown["message"])
    no_tools = _error(http.post(CHAT, json={"model": "m", "messages": MESSAGES,
                                            "tool_choice": "required"}))
    assert "When using `tool_choice`, `tools` must be set." in no_tools["message"]


def test_tool_choice_none_answers_text(http: httpx.Client) -> None:
    reply = http.post(CHAT, json={"model": "m", "messages": MESSAGES, "tools": TOOLS,
                                  "tool_choice": "none", "max_tokens": 2}).json()
    assert reply["choices"][0]["message"]["content"] == "sim filler"


# -- echo, n, prompt lists ---------------------------------------------------------------


def test_echo_prepends_the_prompt(http: httpx.Client) -> None:
    reply = http.post(COMPLETIONS, json={"model": "m", "prompt": "Once upon", "echo": True,
                                         "max_tokens": 2}).json()
    assert reply["choices"][0]["text"] == "Once uponsim filler"
    scored = http.post(COMPLETIONS, json={"model": "m", "prompt": "Once upon", "echo": True,
                                          "max_tokens": 2, "logprobs": 1}).json()
    logprobs = scored["choices"][0]["logprobs"]
    assert "".join(logprobs["tokens"]) == "Once uponsim filler"
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert all(v <= 0 for v in logprobs["token_logprobs"][1:])
    events = _events(http.post(COMPLETIONS, json={"model": "m", "prompt": "Once upon",
                                                  "echo": True, "max_tokens": 2,
                                                  "stream": True}))
    assert "".join(e["choices"][0]["text"] for e in events) == "Once uponsim filler"


def test_echo_of_token_ids_needs_a_tokenizer(http: httpx.Client) -> None:
    error = _error(http.post(COMPLETIONS, json={"model": "m", "prompt": [1, 2, 3],
                                                "echo": True}))
    assert error["param"] == "echo" and "tokenizer.json" in error["message"]


def test_n_choices(http: httpx.Client) -> None:
    reply = http.post(CHAT, json={"model": "m", "messages": MESSAGES, "n": 3,
                                  "max_tokens": 4}).json()
    choices = reply["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert len({c["message"]["content"] for c in choices}) == 3
    assert reply["usage"]["completion_tokens"] == 12
    assert reply["usage"]["prompt_tokens"] > 0
    events = _events(http.post(CHAT, json={
        "model": "m", "messages": MESSAGES, "n": 2, "max_tokens": 3, "stream": True,
        "stream_options": {"include_usage": True}}))
    finished = {e["choices"][0]["index"] for e in events
                if e["choices"] and e["choices"][0]["finish_reason"]}
    assert finished == {0, 1}
    assert events[-1]["usage"]["completion_tokens"] == 6
    assert _error(http.post(CHAT, json={"model": "m", "messages": MESSAGES, "n": 0}))[
        "message"] == "n must be at least 1, got 0."


def test_prompt_lists_give_a_choice_each(http: httpx.Client) -> None:
    single = [http.post(COMPLETIONS, json={"model": "m", "prompt": p, "max_tokens": 2}).json()
              for p in ("alpha", "beta gamma delta")]
    reply = http.post(COMPLETIONS, json={"model": "m", "prompt": ["alpha", "beta gamma delta"],
                                         "max_tokens": 2, "n": 2}).json()
    assert [c["index"] for c in reply["choices"]] == [0, 1, 2, 3]
    assert reply["usage"]["prompt_tokens"] == sum(s["usage"]["prompt_tokens"] for s in single)
    assert reply["usage"]["completion_tokens"] == 8
    ids = http.post(COMPLETIONS, json={"model": "m", "prompt": [[1, 2, 3], [4, 5]],
                                       "max_tokens": 1}).json()
    assert [c["index"] for c in ids["choices"]] == [0, 1]
    assert ids["usage"]["prompt_tokens"] == 5
    events = _events(http.post(COMPLETIONS, json={"model": "m", "prompt": ["a", "b"],
                                                  "max_tokens": 2, "stream": True}))
    assert {e["choices"][0]["index"] for e in events} == {0, 1}


# -- embeddings --------------------------------------------------------------------------


def test_embeddings_dimensions_need_a_matryoshka_model(engines: list[EngineHandle]) -> None:
    plain, mrl = engines[2], engines[3]
    if plain.engine.parts.profile.default_task != "embed":
        pytest.skip("the model loader does not mark this directory as an embedding model")
    error = _error(httpx.post(plain.url + "/v1/embeddings", json={
        "model": "emb", "input": "hi", "dimensions": 256}))
    assert error["message"] == ("Model 'emb' does not support Matryoshka embeddings; "
                                "dimensions must be unset (received dimensions=256).")
    assert error["type"] == "BadRequestError"
    reply = httpx.post(mrl.url + "/v1/embeddings", json={
        "model": "mrl", "input": ["hi", "there"], "dimensions": 256}).json()
    vectors = [d["embedding"] for d in reply["data"]]
    assert [len(v) for v in vectors] == [256, 256]
    assert sum(x * x for x in vectors[0]) == pytest.approx(1.0)
    assert re.fullmatch(r"embd-[0-9a-f]{32}", reply["id"])
    assert abs(reply["created"] - time.time()) < 60
    wrong = _error(httpx.post(mrl.url + "/v1/embeddings", json={
        "model": "mrl", "input": "hi", "dimensions": 100}))
    assert "only supports [256, 512, 1024] matryoshka dimensions" in wrong["message"]


# -- ids, created, metrics ---------------------------------------------------------------


def test_ids_are_unique_random_and_honour_x_request_id(engines: list[EngineHandle]) -> None:
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 1}
    ids = [httpx.post(h.url + CHAT, json=body).json()["id"] for h in engines[:2] for _ in "ab"]
    assert len(set(ids)) == 4
    assert all(re.fullmatch(r"chatcmpl-[0-9a-f]{32}", i) for i in ids)
    tagged = httpx.post(engines[0].url + CHAT, json=body, headers={"X-Request-Id": "abc123"})
    assert tagged.json()["id"] == "chatcmpl-abc123"
    completion = httpx.post(engines[0].url + COMPLETIONS,
                            json={"model": "m", "prompt": "x", "max_tokens": 1}).json()
    assert re.fullmatch(r"cmpl-[0-9a-f]{32}", completion["id"])


def test_stream_chunks_carry_the_calls_unix_time(http: httpx.Client) -> None:
    before = int(time.time())
    events = _events(http.post(CHAT, json={"model": "m", "messages": MESSAGES,
                                           "max_tokens": 2, "stream": True}))
    after = int(time.time())
    assert {e["created"] for e in events} <= set(range(before, after + 1))
    assert len({e["id"] for e in events}) == 1


def _prompt_counters(url: str) -> tuple[float, float]:
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for sample in family.samples:
            values[sample.name] = sample.value
    return values["vllm:prompt_tokens_total"], values["vllm:request_prompt_tokens_sum"]


def test_prompt_tokens_total_counts_one_step_prefills(engines: list[EngineHandle]) -> None:
    url = engines[1].url
    total_before, sum_before = _prompt_counters(url)
    reply = httpx.post(url + COMPLETIONS, json={"model": "m", "prompt": "a short prompt",
                                                "max_tokens": 2}).json()
    total_after, sum_after = _prompt_counters(url)
    prompt = reply["usage"]["prompt_tokens"]
    assert sum_after - sum_before == prompt
    assert total_after - total_before == prompt


def test_vllm_structured_outputs_and_suffix(http: httpx.Client) -> None:
    typed = http.post(CHAT, json={"model": "m", "messages": MESSAGES,
                                  "structured_outputs": {"json": SCHEMA}}).json()
    jsonschema.validate(json.loads(typed["choices"][0]["message"]["content"]), SCHEMA)
    picked = http.post(COMPLETIONS, json={"model": "m", "prompt": "x", "structured_outputs": {
        "choice": ["yes", "no"]}}).json()
    assert picked["choices"][0]["text"] == "yes"
    both = _error(http.post(CHAT, json={"model": "m", "messages": MESSAGES,
                                        "structured_outputs": {"json": SCHEMA,
                                                               "choice": ["a"]}}))
    assert "You can only use one kind of constraints" in both["message"]
    assert both["type"] == "BadRequestError"
    regex = _error(http.post(CHAT, json={"model": "m", "messages": MESSAGES,
                                         "structured_outputs": {"regex": "a+"}}))
    assert regex["param"] == "structured_outputs" and "not simulated" in regex["message"]
    suffix = _error(http.post(COMPLETIONS, json={"model": "m", "prompt": "x", "suffix": "y"}))
    assert suffix["message"] == ("suffix is only supported for models with FIM completion "
                                 "rendering")


def test_fake_vllm_reads_the_logprob_and_tool_flags() -> None:
    config, _ = parse_serve_args(["serve", "m", "--max-logprobs", "5",
                                  "--enable-auto-tool-choice", "--tool-call-parser", "hermes"])
    assert config.max_logprobs == 5 and config.enable_auto_tool_choice
    with pytest.raises(SystemExit, match="--enable-auto-tool-choice requires --tool-call-parser"):
        parse_serve_args(["serve", "m", "--enable-auto-tool-choice"])


@pytest.mark.parametrize("extra", [
    {"tools": [{"type": "function"}]},
    {"tools": [{"type": "retrieval", "function": {"name": "x"}}]},
    {"response_format": {"type": "yaml"}},
    {"response_format": {"type": "json_schema", "json_schema": "not an object"}},
])
def test_malformed_tools_and_formats_get_the_validation_400(
    http: httpx.Client, extra: dict[str, Any]
) -> None:
    error = _error(http.post(CHAT, json={"model": "m", "messages": MESSAGES, **extra}))
    assert error["type"] == "Bad Request" and "validation error" in error["message"]


def test_completions_need_a_prompt(http: httpx.Client) -> None:
    for body in ({"model": "m"}, {"model": "m", "prompt": ""}):
        error = _error(http.post(COMPLETIONS, json=body))
        assert error["param"] == "prompt"
        assert "Either prompt or prompt_embeds must be provided and non-empty." in (
            error["message"])


def test_continuous_usage_stats_put_usage_on_every_chunk(http: httpx.Client) -> None:
    events = _events(http.post(COMPLETIONS, json={
        "model": "m", "prompt": "x", "max_tokens": 3, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}}))
    assert [e["usage"]["completion_tokens"] for e in events] == [1, 2, 3, 3]


def test_prompt_logprobs(http: httpx.Client) -> None:
    reply = http.post(COMPLETIONS, json={"model": "m", "prompt": "alpha beta gamma",
                                         "max_tokens": 1, "prompt_logprobs": 2}).json()
    scored = reply["choices"][0]["prompt_logprobs"]
    assert len(scored) == reply["usage"]["prompt_tokens"] and scored[0] is None
    for entry in scored[1:]:
        ranks = sorted(e["rank"] for e in entry.values())
        assert ranks[0] == 1 and len(entry) <= 3
        assert all(e["logprob"] <= 0 for e in entry.values())
    own = [next(e for e in entry.values() if e["rank"] == 1)["decoded_token"]
           for entry in scored[1:]]
    assert "alpha beta gamma".endswith("".join(own))
    chat = http.post(CHAT, json={"model": "m", "messages": MESSAGES, "max_tokens": 1,
                                 "prompt_logprobs": 0}).json()
    assert len(chat["prompt_logprobs"]) == chat["usage"]["prompt_tokens"]
    streamed = _error(http.post(CHAT, json={"model": "m", "messages": MESSAGES, "stream": True,
                                            "prompt_logprobs": 1}))
    assert "`prompt_logprobs` are not available when `stream=True`." in streamed["message"]
    over = _error(http.post(COMPLETIONS, json={"model": "m", "prompt": "x",
                                               "prompt_logprobs": 21}))
    assert over["message"] == ("Requested prompt logprobs of 21, which is greater than max "
                               "allowed: 20 (parameter=prompt_logprobs, value=21)")
