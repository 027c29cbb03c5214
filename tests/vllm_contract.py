"""The simulator held to real vLLM: the contract's requests, the shape of an answer, and the
differences between two recordings of the same requests.

A recording maps each case to what the server answered, reduced to what a client can rely
on: the status, the content type, the body's shape (every key path with the JSON types seen
there, never the values), an error's type/param/code and message (numbers masked: token
counts differ between two tokenizers' renderings), and for streams the sequence of SSE event
shapes (consecutive events of one shape collapsed: chunking is timing-dependent in vLLM).

`tests/data/vllm_contract/recording.json` holds real vLLM's recording
(`tests/real_engine/test_contract.py` records it live and fails when it drifts;
`INFERPLANE_RECORD_CONTRACT=1` rewrites it). `tests/test_sim_contract.py` replays the cases
against the simulator in the default suite. Every difference must be fixed in the simulator
or listed, with its reason, in docs/simulator.md's contract table (`explained()` reads it).
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
RECORDING = REPO / "tests" / "data" / "vllm_contract" / "recording.json"
DOCS = REPO / "docs" / "simulator.md"
TABLE_HEADING = "## Contract with real vLLM"

CHAT, PLAIN, EMBED, LORA = "chat", "plain", "embed", "lora"
CHAT_NAME, EMBED_NAME = "tiny-llama", "tiny-embed"
MAX_MODEL_LEN = 512
# The LoRA engine's adapters (scripts/make_tiny_adapter.py), written into one directory per
# run; request bodies and command lines name it as ADAPTERS, answers have it masked back.
ADAPTERS = "@ADAPTERS@"
ADAPTER, EXTRA, BIG = "tiny-sql", "tiny-extra", "tiny-big"
ADAPTER_RANKS = {ADAPTER: 8, EXTRA: 8, BIG: 16}  # BIG: above the engine's --max-lora-rank 8

# Each engine: its served name and the flags beyond those every real engine of the tier gets
# (`real_vllm.start_vllm`: --max-model-len 512 --enforce-eager --kv-cache-memory-bytes 64M).
# The simulator parses the same command line (`fake_vllm.parse_serve_args`).
COMMON_ARGS = ("--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager",
               "--kv-cache-memory-bytes", "64M")
SERVED = {CHAT: CHAT_NAME, PLAIN: CHAT_NAME, EMBED: EMBED_NAME, LORA: CHAT_NAME}
ENGINE_ARGS: dict[str, tuple[str, ...]] = {
    CHAT: ("--dtype", "bfloat16", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
           "--structured-outputs-config",
           '{"backend":"xgrammar","disable_any_whitespace":true}'),
    PLAIN: ("--dtype", "bfloat16"),
    EMBED: ("--runner", "pooling", "--dtype", "bfloat16"),
    LORA: ("--dtype", "bfloat16", "--enable-lora", "--max-loras", "1", "--max-lora-rank", "8",
           "--max-cpu-loras", "2", "--lora-modules", f"{ADAPTER}={ADAPTERS}/{ADAPTER}"),
}
ENGINE_MODELS = {CHAT: "tiny-llama", PLAIN: "tiny-llama", EMBED: "tiny-qwen3",
                 LORA: "tiny-llama"}  # tiny_models keys
# Environment beyond the tier's: the LoRA engine opens the runtime load/unload endpoints
# (the plain engine, without it, answers them as unknown routes).
ENGINE_ENV: dict[str, dict[str, str]] = {LORA: {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}}

# Dicts keyed by data (token text, token id), not by field name: their keys become "*".
MAP_PATHS = frozenset({
    "$.choices[].logprobs.top_logprobs[]",
    "$.prompt_logprobs[]",
    "$.choices[].prompt_logprobs[]",
})
_NUMBER = re.compile(r"\d+(\.\d+)?")


@dataclass(frozen=True)
class Case:
    """One request of the contract, sent alike to vLLM and to the simulator."""

    name: str
    engine: str
    path: str
    body: Any = None
    method: str = "POST"
    raw: bytes | None = None  # a body that is not JSON

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and bool(self.body.get("stream"))


# A seed makes real vLLM's sampling repeatable, so a re-recording sees the same outputs.
def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": CHAT_NAME, "messages": [{"role": "user", "content": "Hello there"}],
            "max_tokens": 5, "seed": 1, **fields}


def _completion(**fields: Any) -> dict[str, Any]:
    return {"model": CHAT_NAME, "prompt": "Once upon a time", "max_tokens": 5, "seed": 1,
            **fields}


# Bounded strings and numbers: a random-weight model fills an unbounded string until
# max_tokens, and a cut JSON is not parsed into a tool call.
_CITY = {"type": "string", "minLength": 2, "maxLength": 8}
_SCHEMA = {"type": "object", "properties": {"city": _CITY,
                                            "temp": {"type": "integer", "minimum": -50,
                                                     "maximum": 50}},
           "required": ["city", "temp"], "additionalProperties": False}
_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city", "strict": True,
    "parameters": {"type": "object", "properties": {"city": _CITY},
                   "required": ["city"], "additionalProperties": False}}}
_NAMED = {"type": "function", "function": {"name": "get_weather"}}
_LONG_TEXT = "hello " * 600  # > 512 tokens with any tokenizer
_LONG_IDS = [5] * (MAX_MODEL_LEN + 1)
_TOOL_TURN = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, cloudy"},
]


_CC, _CO, _EM = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"


def _cases() -> list[Case]:
    include_usage = {"stream": True, "stream_options": {"include_usage": True}}
    tools = {"tools": [_TOOL], "parallel_tool_calls": False, "max_tokens": 60}
    chat = [
        Case("chat", CHAT, _CC, _chat()),
        Case("chat_stream", CHAT, _CC, _chat(stream=True)),
        Case("chat_stream_usage", CHAT, _CC, _chat(**include_usage)),
        Case("chat_logprobs", CHAT, _CC, _chat(logprobs=True, top_logprobs=2)),
        Case("chat_stream_logprobs", CHAT, _CC,
             _chat(logprobs=True, top_logprobs=2, stream=True)),
        Case("chat_prompt_logprobs", CHAT, _CC, _chat(prompt_logprobs=1)),
        Case("chat_n2", CHAT, _CC, _chat(n=2)),
        Case("chat_stream_n2", CHAT, _CC, _chat(n=2, **include_usage)),
        Case("chat_json_schema", CHAT, _CC, _chat(
            max_tokens=40, response_format={"type": "json_schema", "json_schema": {
                "name": "weather", "schema": _SCHEMA}})),
        Case("chat_json_object", CHAT, _CC,
             _chat(max_tokens=40, response_format={"type": "json_object"})),
        Case("chat_tools_required", CHAT, _CC,
             _chat(tool_choice="required", **tools)),
        Case("chat_tools_named", CHAT, _CC, _chat(tool_choice=_NAMED, **tools)),
        Case("chat_tools_none", CHAT, _CC, _chat(tool_choice="none", **tools)),
        Case("chat_tools_auto", CHAT, _CC, _chat(tool_choice="auto", **tools)),
        Case("chat_tools_stream_named", CHAT, _CC,
             _chat(tool_choice=_NAMED, stream=True, **tools)),
        Case("chat_tool_result", CHAT, _CC,
             _chat(messages=_TOOL_TURN, tools=[_TOOL])),
        Case("chat_unknown_field", CHAT, _CC, _chat(not_a_field=1)),
        Case("chat_seed_temperature", CHAT, _CC,
             _chat(seed=7, temperature=0.5, top_p=0.9)),
        Case("chat_stop", CHAT, _CC, _chat(stop=["zzz"])),
        Case("chat_max_completion_tokens", CHAT, _CC,
             {**_chat(), "max_completion_tokens": 3}),
    ]
    chat_errors = [
        Case("chat_unknown_model", CHAT, _CC, _chat(model="nope")),
        Case("chat_too_long", CHAT, _CC,
             _chat(messages=[{"role": "user", "content": _LONG_TEXT}])),
        Case("chat_max_tokens_too_large", CHAT, _CC, _chat(max_tokens=100000)),
        Case("chat_no_messages", CHAT, _CC,
             {"model": CHAT_NAME, "max_tokens": 5}),
        Case("chat_n0", CHAT, _CC, _chat(n=0)),
        Case("chat_bad_type_max_tokens", CHAT, _CC, _chat(max_tokens="many")),
        Case("chat_bad_type_stream", CHAT, _CC, _chat(stream="yes please")),
        Case("chat_top_logprobs_alone", CHAT, _CC, _chat(top_logprobs=2)),
        Case("chat_top_logprobs_too_many", CHAT, _CC,
             _chat(logprobs=True, top_logprobs=50)),
        Case("chat_stream_options_alone", CHAT, _CC,
             _chat(stream_options={"include_usage": True})),
        Case("chat_tool_choice_without_tools", CHAT, _CC,
             _chat(tool_choice="required")),
        Case("chat_unknown_named_tool", CHAT, _CC, _chat(
            tool_choice={"type": "function", "function": {"name": "nope"}}, **tools)),
        Case("chat_not_json", CHAT, _CC, raw=b"{not json"),
        Case("chat_on_pooling_model", EMBED, _CC, _chat(model=EMBED_NAME)),
    ]
    plain = [
        Case("plain_tools_auto", PLAIN, _CC, _chat(tool_choice="auto", **tools)),
        Case("plain_tools_required", PLAIN, _CC,
             _chat(tool_choice="required", **tools)),
        Case("plain_tools_named", PLAIN, _CC,
             _chat(tool_choice=_NAMED, **tools)),
        Case("plain_tools_none", PLAIN, _CC, _chat(tool_choice="none", **tools)),
    ]
    completions = [
        Case("completion", CHAT, _CO, _completion()),
        Case("completion_stream", CHAT, _CO, _completion(**include_usage)),
        Case("completion_logprobs", CHAT, _CO, _completion(logprobs=2)),
        Case("completion_stream_logprobs", CHAT, _CO,
             _completion(logprobs=2, stream=True)),
        Case("completion_echo", CHAT, _CO, _completion(echo=True)),
        Case("completion_echo_logprobs", CHAT, _CO, _completion(echo=True, logprobs=1)),
        Case("completion_stream_echo", CHAT, _CO, _completion(echo=True, stream=True)),
        Case("completion_n2", CHAT, _CO, _completion(n=2)),
        Case("completion_token_ids", CHAT, _CO, _completion(prompt=[5, 6, 7, 8])),
        Case("completion_prompt_list", CHAT, _CO, _completion(prompt=["a b", "c d"])),
        Case("completion_prompt_logprobs", CHAT, _CO, _completion(prompt_logprobs=1)),
        Case("completion_json_schema", CHAT, _CO, _completion(
            max_tokens=40, response_format={"type": "json_schema", "json_schema": {
                "name": "weather", "schema": _SCHEMA}})),
        Case("completion_too_long", CHAT, _CO, _completion(prompt=_LONG_IDS)),
        Case("completion_max_tokens_too_large", CHAT, _CO,
             _completion(max_tokens=100000)),
        Case("completion_unknown_model", CHAT, _CO, _completion(model="nope")),
        Case("completion_no_prompt", CHAT, _CO, {"model": CHAT_NAME}),
        Case("completion_suffix", CHAT, _CO, _completion(suffix="The end.")),
        Case("completion_bad_type_prompt", CHAT, _CO, _completion(prompt=3.5)),
        Case("completion_logprobs_too_many", CHAT, _CO, _completion(logprobs=50)),
    ]
    other = [
        Case("health", CHAT, "/health", method="GET"),
        Case("models", CHAT, "/v1/models", method="GET"),
        Case("models_pooling", EMBED, "/v1/models", method="GET"),
        Case("model_by_id", CHAT, f"/v1/models/{CHAT_NAME}", method="GET"),
        Case("unknown_route", CHAT, "/v1/nothing-here", method="GET"),
        Case("responses", CHAT, "/v1/responses",
             {"model": CHAT_NAME, "input": "Hello there", "max_output_tokens": 5}),
        Case("responses_stream", CHAT, "/v1/responses",
             {"model": CHAT_NAME, "input": "Hello there", "max_output_tokens": 5, "stream": True}),
        Case("responses_unknown_model", CHAT, "/v1/responses",
             {"model": "nope", "input": "Hello there", "max_output_tokens": 5}),
        Case("tokenize", CHAT, "/tokenize", {"model": CHAT_NAME, "prompt": "hello world"}),
        Case("tokenize_chat", CHAT, "/tokenize",
             {"model": CHAT_NAME, "messages": [{"role": "user", "content": "hello world"}]}),
        Case("tokenize_unknown_model", CHAT, "/tokenize", {"model": "nope", "prompt": "hi"}),
        Case("detokenize", CHAT, "/detokenize", {"model": CHAT_NAME, "tokens": [5, 6, 7]}),
    ]
    embed = [
        Case("embeddings", EMBED, _EM, {"model": EMBED_NAME, "input": "hello world"}),
        Case("embeddings_list", EMBED, _EM,
             {"model": EMBED_NAME, "input": ["hello", "world"]}),
        Case("embeddings_token_ids", EMBED, _EM, {"model": EMBED_NAME, "input": [5, 6, 7]}),
        Case("embeddings_base64", EMBED, _EM,
             {"model": EMBED_NAME, "input": "hello", "encoding_format": "base64"}),
        Case("embeddings_dimensions", EMBED, _EM,
             {"model": EMBED_NAME, "input": "hello", "dimensions": 16}),
        Case("embeddings_too_long", EMBED, _EM, {"model": EMBED_NAME, "input": _LONG_IDS}),
        Case("embeddings_unknown_model", EMBED, _EM, {"model": "nope", "input": "hi"}),
        Case("embeddings_bad_type", EMBED, _EM, {"model": EMBED_NAME, "input": 3.5}),
        Case("embeddings_on_generate_model", CHAT, _EM,
             {"model": CHAT_NAME, "input": "hello"}),
    ]
    return [*chat, *chat_errors, *plain, *completions, *other, *embed, *_lora_cases()]


_LOAD, _UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"


def _load(name: str, directory: str | None = None, **fields: Any) -> dict[str, Any]:
    return {"lora_name": name, "lora_path": f"{ADAPTERS}/{directory or name}", **fields}


def _lora_cases() -> list[Case]:
    """vLLM's adapter registry, in order (each case sees the state the previous left)."""
    return [
        Case("lora_models", LORA, "/v1/models", method="GET"),
        Case("lora_model_by_id", LORA, f"/v1/models/{ADAPTER}", method="GET"),
        Case("lora_chat", LORA, _CC, _chat(model=ADAPTER)),
        Case("lora_chat_stream", LORA, _CC, _chat(model=ADAPTER, stream=True)),
        Case("lora_completion", LORA, _CO, _completion(model=ADAPTER)),
        Case("lora_chat_unknown_adapter", LORA, _CC, _chat(model="tiny-nope")),
        Case("lora_load", LORA, _LOAD, _load(EXTRA)),
        Case("lora_load_twice", LORA, _LOAD, _load(EXTRA)),
        Case("lora_load_inplace", LORA, _LOAD, _load(EXTRA, load_inplace=True)),
        Case("lora_load_static_again", LORA, _LOAD, _load(ADAPTER)),
        Case("lora_chat_loaded", LORA, _CC, _chat(model=EXTRA)),
        Case("lora_models_loaded", LORA, "/v1/models", method="GET"),
        Case("lora_load_base_name", LORA, _LOAD, _load(CHAT_NAME, EXTRA)),
        Case("lora_load_no_path", LORA, _LOAD, {"lora_name": "tiny-x"}),
        Case("lora_load_empty_name", LORA, _LOAD, _load("", EXTRA)),
        Case("lora_unload", LORA, _UNLOAD, {"lora_name": EXTRA}),
        Case("lora_unload_twice", LORA, _UNLOAD, {"lora_name": EXTRA}),
        Case("lora_unload_no_name", LORA, _UNLOAD, {}),
        Case("lora_chat_unloaded", LORA, _CC, _chat(model=EXTRA)),
        Case("lora_load_missing_dir", LORA, _LOAD, _load("tiny-gone", "no-such-dir")),
        Case("lora_load_rank_too_large", LORA, _LOAD, _load(BIG)),
        Case("lora_models_end", LORA, "/v1/models", method="GET"),
        Case("plain_load_lora_disabled", PLAIN, _LOAD, _load(EXTRA)),
        Case("plain_unload_lora_disabled", PLAIN, _UNLOAD, {"lora_name": EXTRA}),
        Case("plain_chat_adapter_without_lora", PLAIN, _CC, _chat(model=ADAPTER)),
    ]


def make_adapters(out: Path, base: Path) -> Path:
    """The LoRA engine's adapter directories under `out`, for the base model in `base`
    (its config.json is enough: scripts/make_tiny_adapter.py is pure Python and seeded)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "make_tiny_adapter", REPO / "scripts" / "make_tiny_adapter.py")
    assert spec is not None and spec.loader is not None
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    for seed, (name, rank) in enumerate(ADAPTER_RANKS.items()):
        maker.write_adapter(out / name, base, rank=rank, seed=seed, base_name=str(base))
    return out


CASES: tuple[Case, ...] = tuple(_cases())


# -- shapes -------------------------------------------------------------------------------


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, list):
        return "list"
    return "object"


def _walk(value: Any, path: str, out: dict[str, set[str]]) -> None:
    out.setdefault(path, set()).add(_kind(value))
    if isinstance(value, dict):
        for key, item in value.items():
            _walk(item, f"{path}.{'*' if path in MAP_PATHS else key}", out)
    elif isinstance(value, list):
        for item in value:
            _walk(item, f"{path}[]", out)


def shape(value: Any) -> dict[str, str]:
    """Every key path of a JSON value with the types seen there (`int|null`), no values."""
    out: dict[str, set[str]] = {}
    _walk(value, "$", out)
    # float and int both mean "a number" where JSON drops a float's ".0" (vLLM's 1.0).
    return {path: "|".join(sorted(kinds)) for path, kinds in sorted(out.items())}


def mask(message: str) -> str:
    """A message with its numbers masked (token counts differ between tokenizers)."""
    return _NUMBER.sub("N", message)


def _error(body: Any) -> dict[str, Any] | None:
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return None
    full = str(error.get("message"))
    message = full
    if error.get("type") == "Bad Request":
        # A validation error: the first line and the failing field locations (pydantic's
        # wording of each error differs between versions, the fields must not).
        locs = re.findall(r"'loc': ('[^']*'|\([^)]*\))", full)
        message = " ".join([full.split("\n", 1)[0], *sorted(set(locs))])
    return {"type": error.get("type"), "param": error.get("param"), "code": error.get("code"),
            "message": mask(message), "full_message": mask(full)}  # the latter: for review


def _events(text: str) -> list[Any]:
    """The SSE events of a stream: `data:` JSON shapes (`event:` names kept), `[DONE]`."""
    events: list[Any] = []
    name: str | None = None
    for line in text.splitlines():
        if line.startswith("event:"):
            name = line[len("event:"):].strip()
        elif line.startswith("data:"):
            data = line[len("data:"):].strip()
            if data == "[DONE]":
                events.append("[DONE]")
            else:
                event: dict[str, Any] = {"shape": shape(json.loads(data))}
                if name is not None:
                    event["event"] = name
                events.append(event)
            name = None
    collapsed: list[Any] = []
    for event in events:  # consecutive events of one shape: chunking is timing-dependent
        if not collapsed or collapsed[-1] != event:
            collapsed.append(event)
    return collapsed


def answer(response: httpx.Response, stream: bool) -> dict[str, Any]:
    """What a client can rely on in one response."""
    content_type = response.headers.get("content-type", "").split(";")[0].strip()
    out: dict[str, Any] = {"status": response.status_code, "content_type": content_type}
    if stream and response.status_code == 200:
        out["events"] = _events(response.text)
        return out
    if not response.content:
        out["body"] = None
        return out
    try:
        body = response.json()
    except ValueError:
        out["body"] = "<not json>"
        return out
    out["body"] = shape(body)
    error = _error(body)
    if error is not None:
        out["error"] = error
    elif isinstance(body, dict) and set(body) == {"detail"}:
        out["detail"] = body["detail"]
    return out


def _swap(value: Any, old: str, new: str) -> Any:
    """`value` with every string's `old` replaced by `new` (JSON-shaped values)."""
    return json.loads(json.dumps(value).replace(old, new)) if value is not None else None


def record_case(client: httpx.Client, base_url: str, case: Case,
                adapters: Path | None = None) -> dict[str, Any]:
    """Send one case; its answer (the adapters' directory named ADAPTERS in both)."""
    url = base_url + case.path
    where = str(adapters) if adapters is not None else ""
    if case.method == "GET":
        response = client.get(url)
    elif case.raw is not None:
        response = client.post(url, content=case.raw, headers={"content-type": "application/json"})
    else:
        response = client.post(url, json=_swap(case.body, ADAPTERS, where))
    if where and where.encode() in response.content:  # before answer() masks its digits
        response = httpx.Response(response.status_code, headers=response.headers,
                                  content=response.content.replace(where.encode(),
                                                                   ADAPTERS.encode()))
    return answer(response, case.stream)


def record(urls: Mapping[str, str], cases: Iterable[Case] = CASES,
           timeout_s: float = 120.0, adapters: Path | None = None) -> dict[str, Any]:
    """Every case against the engines at `urls` (engine kind -> base URL)."""
    with httpx.Client(timeout=timeout_s) as client:
        return {case.name: record_case(client, urls[case.engine], case, adapters)
                for case in cases if case.engine in urls}


# -- metrics ------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^(vllm:[A-Za-z0-9_:]+)(?:\{([^}]*)\})?\s")
_SUFFIXES = ("_bucket", "_count", "_sum", "_created", "_total")


def metric_families(text: str) -> dict[str, str]:
    """vLLM metric families in a /metrics text: name (`# TYPE`) -> sorted label names."""
    types = dict(re.findall(r"^# TYPE (vllm:\S+) (\S+)", text, re.M))
    labels: dict[str, set[str]] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match:
            continue
        name = match.group(1)
        family = name
        for suffix in _SUFFIXES:
            if family not in types and family.endswith(suffix):
                family = family[: -len(suffix)]
        if family not in types:
            continue
        keys = {kv.split("=", 1)[0] for kv in re.findall(r'(\w+)="', match.group(2) or "")}
        labels.setdefault(family, set()).update(keys - {"le"})
    return {name: f"{types[name]} {{{','.join(sorted(labels.get(name, set())))}}}"
            for name in sorted(types) if not name.endswith("_created")}


# -- differences --------------------------------------------------------------------------


def _shape_diffs(prefix: str, real: Mapping[str, str], sim: Mapping[str, str]) -> list[str]:
    diffs = []
    for path in sorted(set(real) | set(sim)):
        if path not in sim:
            diffs.append(f"{prefix}{path}: missing ({real[path]})")
        elif path not in real:
            diffs.append(f"{prefix}{path}: extra ({sim[path]})")
        elif real[path] != sim[path]:
            diffs.append(f"{prefix}{path}: type {real[path]} != {sim[path]}")
    return diffs


def _event_label(event: Any) -> str:
    if event == "[DONE]":
        return "[DONE]"
    return str(event.get("event") or event["shape"].get("$.type", "chunk"))


def _merged(events: list[Any]) -> dict[str, str]:
    """One shape for several chunks: every path any of them has, with the types seen; `null`
    only where nothing else was (a field null in some chunks and set in one, such as
    `finish_reason`, reads the same whether a stream came in two chunks or twenty)."""
    kinds: dict[str, set[str]] = {}
    for event in events:
        for path, kind in event["shape"].items():
            kinds.setdefault(path, set()).update(kind.split("|"))
    return {path: "|".join(sorted(k - {"null"} or k)) for path, k in sorted(kinds.items())}


def _chunk_class(event: Any) -> str:
    shape = event["shape"]
    if shape.get("$.choices") == "list" and "$.choices[]" not in shape:
        return "usage"  # `choices: []` with the usage of the whole stream
    if "$.choices[].delta.role" in shape:
        return "role"
    return "tokens"


def _stream_diffs(name: str, real: list[Any], sim: list[Any]) -> list[str]:
    """Named SSE events (the Responses API): the sequence of names, then each event's shape.
    Chat/completions chunks by class (the role chunk, token chunks merged, the usage chunk):
    how many tokens one chunk carries depends on timing in vLLM (a busy server sends several
    at once, a short answer may come in one chunk), the classes and their fields do not."""
    out: list[str] = []
    if any(isinstance(e, dict) and "event" in e for e in real):
        real_labels, sim_labels = [_event_label(e) for e in real], [_event_label(e) for e in sim]
        if real_labels != sim_labels:
            return [f"{name} events: {real_labels} != {sim_labels}"]
        for i, (r, s) in enumerate(zip(real, sim, strict=True)):
            if r != s and r != "[DONE]":
                out += _shape_diffs(f"{name} event[{i}]", r["shape"], s["shape"])
        return out
    for side, events in (("real", real), ("sim", sim)):
        if not events or events[-1] != "[DONE]":
            out.append(f"{name} events: {side} stream does not end with [DONE]")
    classes: dict[str, tuple[list[Any], list[Any]]] = {}
    for index, events in enumerate((real, sim)):
        for event in events:
            if event != "[DONE]":
                classes.setdefault(_chunk_class(event), ([], []))[index].append(event)
    for kind, (real_chunks, sim_chunks) in sorted(classes.items()):
        if not real_chunks or not sim_chunks:
            out.append(f"{name} {kind} chunks: {len(real_chunks)} != {len(sim_chunks)}")
        else:
            out += _shape_diffs(f"{name} {kind} ", _merged(real_chunks), _merged(sim_chunks))
    return out


def case_diffs(name: str, real: Mapping[str, Any], sim: Mapping[str, Any]) -> list[str]:
    """Differences of one case, each one line: `<case> <what>: <how>`."""
    out: list[str] = []
    for key in ("status", "content_type", "detail"):
        if real.get(key) != sim.get(key):
            out.append(f"{name} {key}: {real.get(key)!r} != {sim.get(key)!r}")
    real_error, sim_error = real.get("error") or {}, sim.get("error") or {}
    for key in ("type", "param", "code", "message"):
        if real_error.get(key) != sim_error.get(key):
            out.append(f"{name} error.{key}: {real_error.get(key)!r} != {sim_error.get(key)!r}")
    if real.get("status") != sim.get("status"):
        return out  # the bodies of different answers are not comparable
    if "events" in real or "events" in sim:
        out += _stream_diffs(name, real.get("events") or [], sim.get("events") or [])
    elif real.get("error") is None and isinstance(real.get("body"), dict):
        out += _shape_diffs(f"{name} ", real["body"], sim.get("body") or {})
    elif real.get("body") != sim.get("body"):
        out.append(f"{name} body: {real.get('body')!r} != {sim.get('body')!r}")
    return out


def differences(real: Mapping[str, Any], sim: Mapping[str, Any]) -> list[str]:
    """Every difference between two recordings (cases, then metrics)."""
    out: list[str] = []
    for name in sorted(set(real.get("cases", {})) | set(sim.get("cases", {}))):
        r, s = real.get("cases", {}).get(name), sim.get("cases", {}).get(name)
        if r is None or s is None:
            out.append(f"{name} recorded: {r is not None} != {s is not None}")
            continue
        out += case_diffs(name, r, s)
    for engine in sorted(set(real.get("metrics", {})) | set(sim.get("metrics", {}))):
        r_m = real.get("metrics", {}).get(engine, {})
        s_m = sim.get("metrics", {}).get(engine, {})
        for family in sorted(set(r_m) | set(s_m)):
            if family not in s_m:
                out.append(f"metrics.{engine} {family}: missing")
            elif family not in r_m:
                out.append(f"metrics.{engine} {family}: extra")
            elif r_m[family] != s_m[family]:
                out.append(f"metrics.{engine} {family}: {r_m[family]} != {s_m[family]}")
    return out


@dataclass(frozen=True)
class Explanation:
    """One row of docs/simulator.md's contract table: a pattern and why it differs."""

    case: str  # fnmatch pattern over case names (`chat_*`), or `metrics.<engine>`
    difference: str  # fnmatch pattern over the rest of the difference line
    reason: str
    row: int = field(default=0, compare=False)

    def matches(self, diff: str) -> bool:
        case, _, rest = diff.partition(" ")
        return fnmatch.fnmatchcase(case, self.case) and fnmatch.fnmatchcase(rest, self.difference)


def explained(docs: Path = DOCS) -> list[Explanation]:
    """The contract table's rows (`| \\`case\\` | \\`difference\\` | reason |`)."""
    text = docs.read_text(encoding="utf-8")
    start = text.index(TABLE_HEADING)
    rows = []
    for number, line in enumerate(text[start:].splitlines()):
        if number and line.startswith("## "):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        rows.append(Explanation(cells[0].strip("`"), cells[1].strip("`"), cells[2], number))
    return rows


def unexplained(diffs: Iterable[str], rows: Iterable[Explanation]) -> tuple[list[str], list[str]]:
    """Differences no row explains, and rows that explain no difference (stale)."""
    rows = list(rows)
    diffs = list(diffs)
    missing = [d for d in diffs if not any(r.matches(d) for r in rows)]
    stale = [f"{r.case} {r.difference}" for r in rows if not any(r.matches(d) for d in diffs)]
    return missing, stale


# -- the two sides ------------------------------------------------------------------------


def engine_args(kind: str, adapters: Path | None = None) -> list[str]:
    """The flags of one contract engine beyond COMMON_ARGS (the adapters' directory in)."""
    where = str(adapters) if adapters is not None else ADAPTERS
    return [arg.replace(ADAPTERS, where) for arg in ENGINE_ARGS[kind]]


def serve_argv(kind: str, model_dir: Path, port: int, adapters: Path | None = None) -> list[str]:
    """The `vllm serve` command line of one contract engine (after the executable)."""
    return ["serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
            "--served-model-name", SERVED[kind], *COMMON_ARGS, *engine_args(kind, adapters)]


def record_metrics(urls: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Metric families and label names of each engine's /metrics (after the cases ran)."""
    with httpx.Client(timeout=30.0) as client:
        return {kind: metric_families(client.get(url + "/metrics").text)
                for kind, url in urls.items()}


def record_simulator(model_dirs: Mapping[str, Path], adapters: Path,
                     kinds: Iterable[str] = (CHAT, PLAIN, EMBED, LORA)) -> dict[str, Any]:
    """The contract against simulated engines started from the real engines' command lines
    and environment (`adapters`: a directory make_adapters wrote)."""
    import dataclasses

    from inferplane.sim import EngineHost
    from inferplane.sim.fake_vllm import parse_serve_args
    from inferplane.sim.lora import runtime_updates_from_env

    kinds = list(kinds)
    configs = []
    for kind in kinds:
        config = parse_serve_args(serve_argv(kind, model_dirs[ENGINE_MODELS[kind]], 0,
                                             adapters))[0]
        if config.lora is not None:  # the engine's environment, not this process's
            config = dataclasses.replace(config, lora=dataclasses.replace(
                config.lora, runtime_updates=runtime_updates_from_env(ENGINE_ENV.get(kind, {}))))
        configs.append(config)
    with EngineHost(configs) as handles:
        urls = {kind: handle.url for kind, handle in zip(kinds, handles, strict=True)}
        cases = record(urls, adapters=adapters)
        return {"cases": cases, "metrics": record_metrics(urls)}


def load_recording(path: Path = RECORDING) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def save_recording(data: Mapping[str, Any], path: Path = RECORDING) -> None:
    """Write atomically (a half-written recording would fail every default run)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)


# vLLM >= 0.2x prints the KV cache size and the concurrency on one line; the CPU build says
# "CPU KV cache size", the GPU worker "GPU KV cache size".
KV_LINE = re.compile(
    r"\[kv_cache_utils\.py:\d+\] (GPU|CPU) KV cache size: ([\d,]+) tokens, Maximum "
    r"concurrency for ([\d,]+) tokens per request: ([\d.]+)x$", re.M)


def kv_line(log: str) -> dict[str, str] | None:
    """The numbers of an engine log's KV cache line, or None when it has none."""
    match = KV_LINE.search(log)
    if match is None:
        return None
    return {"device": match.group(1), "tokens": match.group(2),
            "max_model_len": match.group(3), "concurrency": match.group(4)}
