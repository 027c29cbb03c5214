"""Token counting for prompts, and the filler text the simulator "generates".

With a model directory that has `tokenizer.json`, prompts are counted by the real tokenizer
(`tokenizers`). Without one the count is an approximation: text is split into words and
punctuation marks, and each piece costs ceil(len/4) tokens (English BPE vocabularies average
about four characters per token). Token ids are stable hashes of the pieces, so equal
prompts give equal ids and prefix caching behaves as it would with a real tokenizer.

Generated text is filler, clearly so: the words of `FILLER_WORDS` in turn, one per token.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

FILLER_WORDS: tuple[str, ...] = (
    " sim", " filler", " token", " lorem", " ipsum", " dolor", " sit", " amet",
)
_PIECE = re.compile(r"\w+|[^\w\s]")
_CHARS_PER_TOKEN = 4


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...


class ApproxTokenizer:
    """Deterministic approximation: ceil(len/4) tokens per word or punctuation mark."""

    def __init__(self, vocab_size: int = 32000) -> None:
        self.vocab_size = max(vocab_size, 2)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in _PIECE.findall(text):
            for i in range(-(-len(piece) // _CHARS_PER_TOKEN)):
                chunk = piece[i * _CHARS_PER_TOKEN : (i + 1) * _CHARS_PER_TOKEN]
                ids.append(zlib.crc32(chunk.encode()) % self.vocab_size)
        return ids


class HfTokenizer:
    """A model's own `tokenizer.json`, without special tokens."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as _Tokenizer

        self._tok = _Tokenizer.from_file(str(path))

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)


def load_tokenizer(model_dir: Path | None, vocab_size: int) -> Tokenizer:
    """The directory's tokenizer.json when present, else the documented approximation."""
    if model_dir is not None and (model_dir / "tokenizer.json").is_file():
        return HfTokenizer(model_dir / "tokenizer.json")
    return ApproxTokenizer(vocab_size)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts; only text parts carry tokens here
        return "".join(
            str(part.get("text", "")) for part in content if isinstance(part, dict)
        )
    return ""


def chat_prompt_ids(tokenizer: Tokenizer, messages: Sequence[dict[str, Any]]) -> list[int]:
    """Token ids of a chat rendered with a generic template (role header + content)."""
    rendered = "".join(
        f"<|{message.get('role', 'user')}|>\n{_content_text(message.get('content'))}\n"
        for message in messages
    )
    return tokenizer.encode(rendered + "<|assistant|>\n")


def filler_piece(index: int) -> str:
    """Text of output token number `index`."""
    return FILLER_WORDS[index % len(FILLER_WORDS)]


def filler_text(count: int) -> str:
    return "".join(filler_piece(i) for i in range(count))


def apply_stop(count: int, stop: Sequence[str]) -> tuple[int, str | None]:
    """Tokens to generate before a stop string completes, and which stop matched."""
    if not stop:
        return count, None
    text = ""
    for i in range(count):
        text += filler_piece(i)
        for s in stop:
            if s and s in text:
                return i + 1, s
    return count, None


def visible_text(count: int, stop: str | None) -> str:
    """The text returned for `count` tokens; a matched stop string is cut off (like vLLM)."""
    text = filler_text(count)
    if stop is not None:
        text = text[: text.index(stop)]
    return text
