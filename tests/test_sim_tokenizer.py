"""Prompt tokens are counted with the model's tokenizer.json when the directory has one, and
`/v1/models` says when counts are approximate (issue 18.9). The tokenizer is built here with
the `tokenizers` library itself; nothing is downloaded."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from inferplane.errors import InferplaneError
from inferplane.sim.build import DEFAULT_PROFILE_CONFIG
from inferplane.sim.config import SimEngineConfig
from inferplane.sim.host import EngineHandle, EngineHost
from inferplane.sim.tokens import ApproxTokenizer, load_tokenizer, render_chat

WORDS = ["[UNK]", "internationalization", "is", "wonderful", "user", "assistant", "hello",
         "the", "cat"]
SPECIAL = ["<|im_start|>", "<|im_end|>"]
PROMPT = "internationalization is wonderful"


def _tokenizer() -> Tokenizer:
    vocab = {word: i for i, word in enumerate(WORDS)}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.add_special_tokens(SPECIAL)
    return tok


def _model_dir(path: Path, *, template: str | None) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps(DEFAULT_PROFILE_CONFIG))
    _tokenizer().save(str(path / "tokenizer.json"))
    if template is not None:
        (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    return path


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[EngineHandle]]:
    base = tmp_path_factory.mktemp("tok")
    chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n" \
             "{% endfor %}"
    configs = [
        SimEngineConfig(model="tok", model_dir=_model_dir(base / "chatml", template=chatml),
                        max_model_len=1024),
        SimEngineConfig(model="approx", max_model_len=1024),
    ]
    with EngineHost(configs) as handles:
        yield handles


def _prompt_tokens(url: str, path: str, body: dict[str, object]) -> int:
    response = httpx.post(url + path, json={**body, "max_tokens": 1}, timeout=10)
    assert response.status_code == 200, response.text
    return int(response.json()["usage"]["prompt_tokens"])


def test_completion_prompt_is_counted_by_the_tokenizer(engines: list[EngineHandle]) -> None:
    real = _prompt_tokens(engines[0].url, "/v1/completions", {"model": "tok", "prompt": PROMPT})
    assert real == len(_tokenizer().encode(PROMPT, add_special_tokens=False).ids) == 3
    approx = _prompt_tokens(engines[1].url, "/v1/completions",
                            {"model": "approx", "prompt": PROMPT})
    assert approx == len(ApproxTokenizer().encode(PROMPT)) == 9  # ceil(len/4) per word


def test_chat_is_rendered_in_the_templates_family(engines: list[EngineHandle]) -> None:
    messages = [{"role": "user", "content": "hello"}]
    count = _prompt_tokens(engines[0].url, "/v1/chat/completions",
                           {"model": "tok", "messages": messages})
    rendered = render_chat("chatml", messages)
    assert rendered == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    # <|im_start|> user hello <|im_end|> <|im_start|> assistant: special tokens count once.
    assert count == len(_tokenizer().encode(rendered, add_special_tokens=False).ids) == 6


def test_models_say_how_tokens_are_counted(engines: list[EngineHandle]) -> None:
    real = httpx.get(engines[0].url + "/v1/models").json()["data"][0]
    approx = httpx.get(engines[1].url + "/v1/models").json()["data"][0]
    assert real["inferplane"]["token_counts"] == "tokenizer"
    assert approx["inferplane"]["token_counts"] == "approximate"
    assert real["object"] == "model" and real["id"] == "tok"  # OpenAI's shape stays valid


def test_echo_decodes_token_ids_with_the_tokenizer(engines: list[EngineHandle]) -> None:
    tok = _tokenizer()
    ids = tok.encode("the cat", add_special_tokens=False).ids
    reply = httpx.post(engines[0].url + "/v1/completions", json={
        "model": "tok", "prompt": ids, "echo": True, "max_tokens": 1, "logprobs": 0}).json()
    choice = reply["choices"][0]
    assert choice["text"].startswith("the cat")
    assert choice["logprobs"]["tokens"][:2] == ["the", "cat"]


def test_a_broken_tokenizer_file_names_itself(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(InferplaneError) as caught:
        load_tokenizer(tmp_path, 1000)
    assert "tokenizer.json" in str(caught.value)
