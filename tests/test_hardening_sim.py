"""The simulator answers malformed bodies with vLLM's validation 400, never a 500 (issue 19.1:
a 500 made the gateway eject healthy replicas)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferplane.sim.config import SimEngineConfig
from inferplane.sim.host import EngineHandle, EngineHost


@pytest.fixture(scope="module")
def engines() -> Iterator[list[EngineHandle]]:
    # vLLM registers /v1/embeddings only for pooling models (404 elsewhere): one of each
    configs = [SimEngineConfig(model="sim", max_model_len=2048, eos_after_tokens=8),
               SimEngineConfig(model="sim", max_model_len=2048, runner="pooling")]
    with EngineHost(configs) as handles:
        yield handles


class _ByTask:
    """Posts a generate path to the generate engine, /v1/embeddings to the pooling one."""

    def __init__(self, generate: httpx.Client, pooling: httpx.Client) -> None:
        self.generate, self.pooling = generate, pooling

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return (self.pooling if path == "/v1/embeddings" else self.generate).post(path, **kwargs)


@pytest.fixture(scope="module")
def client(engines: list[EngineHandle]) -> Iterator[_ByTask]:
    with httpx.Client(base_url=engines[0].url, timeout=10) as generate, \
            httpx.Client(base_url=engines[1].url, timeout=10) as pooling:
        yield _ByTask(generate, pooling)


CHAT = "/v1/chat/completions"
MALFORMED: list[tuple[str, dict[str, Any]]] = [
    (CHAT, {"model": "sim", "messages": [1, 2]}),
    (CHAT, {"model": "sim", "messages": ["hi"]}),
    (CHAT, {"model": "sim", "messages": [{"content": "no role"}]}),
    (CHAT, {"model": "sim", "messages": [{"role": "user", "content": 5}]}),
    (CHAT, {"model": "sim", "messages": [{"role": "user", "content": [1]}]}),
    (CHAT, {"model": "sim", "messages": "hi"}),
    (
        CHAT,
        {
            "model": "sim",
            "messages": [{"role": "user", "content": "x"}],
            "stream": True,
            "stream_options": "yes",
        },
    ),
    (CHAT, {"model": "sim", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}),
    (CHAT, {"model": "sim", "messages": [{"role": "user", "content": "x"}], "stop": 5}),
    (CHAT, {"model": "sim", "messages": [{"role": "user", "content": "x"}], "tools": "x"}),
    ("/v1/completions", {"model": "sim", "prompt": {"a": 1}}),
    ("/v1/completions", {"model": "sim", "prompt": "x", "logprobs": "many"}),
    ("/v1/embeddings", {"model": "sim", "input": {"a": 1}}),
    ("/v1/embeddings", {"model": "sim", "input": [None]}),
]


@pytest.mark.parametrize(("path", "body"), MALFORMED)
def test_malformed_fields_get_vllms_validation_400(
    client: _ByTask, path: str, body: dict[str, Any]
) -> None:
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "Bad Request" and error["code"] == 400
    assert "validation error" in error["message"]


SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
FIELDS = ["messages", "stream", "stream_options", "max_tokens", "n", "stop", "temperature",
          "prompt", "input", "tools", "response_format", "logprobs", "ignore_eos"]  # fmt: skip


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    path=st.sampled_from([CHAT, "/v1/completions", "/v1/embeddings"]),
    fields=st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=4),
)
def test_fuzzed_bodies_never_get_a_5xx(
    client: _ByTask, path: str, fields: dict[str, Any]
) -> None:
    body = {"model": "sim", "max_tokens": 2, **fields}
    r = client.post(path, json=body)
    assert r.status_code < 500, (body, r.text)
