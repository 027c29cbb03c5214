"""Token counting for prompts, and the filler text the simulator "generates".

With a model directory that has `tokenizer.json`, prompts are counted by the real tokenizer
(`tokenizers`, loaded once per engine). Without one the count is an approximation: text is
split into words and punctuation marks, and each piece costs ceil(len/4) tokens (English BPE
vocabularies average about four characters per token); `/v1/models` then says
`"inferplane": {"token_counts": "approximate"}`. Token ids are stable hashes of the pieces,
so equal prompts give equal ids and prefix caching behaves as it would with a real tokenizer.

Chat prompts are rendered roughly as the model's template would (`chat_prompt_ids`): the
family is recognised from `tokenizer_config.json`'s `chat_template` (ChatML `<|im_start|>`,
Llama 3 `<|start_header_id|>`), else a generic `<|role|>` header per message; the rendered
text is then counted by the tokenizer, so the model's special tokens count as one token each.

Generated text is filler, clearly so: the words of `FILLER_WORDS` in turn, one per token;
the first token of an output has no leading space (`sim filler token`), as a model's answer
starts with a word, not a space.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from inferplane.errors import InferplaneError

FILLER_WORDS: tuple[str, ...] = (
    " sim", " filler", " token", " lorem", " ipsum", " dolor", " sit", " amet",
)
_PIECE = re.compile(r"\w+|[^\w\s]")
_CHARS_PER_TOKEN = 4


class Tokenizer(Protocol):
    approximate: bool  # True when counts come from text length, not the model's tokenizer
    chat_family: str  # "chatml", "llama3" or "generic": how chat prompts are rendered

    def encode(self, text: str) -> list[int]: ...

    def pieces(self, text: str) -> list[str]:
        """The text of each token of `text` (one per id of `encode`)."""
        ...

    def decode(self, ids: list[int]) -> str | None:
        """The text of token ids, or None when it cannot be known (no tokenizer.json)."""
        ...


class ApproxTokenizer:
    """Deterministic approximation: ceil(len/4) tokens per word or punctuation mark."""

    approximate = True
    chat_family = "generic"

    def __init__(self, vocab_size: int = 32000) -> None:
        self.vocab_size = max(vocab_size, 2)

    def pieces(self, text: str) -> list[str]:
        """Chunks of `encode`, each carrying the whitespace before it (they join to `text`)."""
        out: list[str] = []
        end = 0
        for match in _PIECE.finditer(text):
            piece = match.group()
            chunks = [piece[i : i + _CHARS_PER_TOKEN]
                      for i in range(0, len(piece), _CHARS_PER_TOKEN)]
            chunks[0] = text[end : match.start()] + chunks[0]
            out.extend(chunks)
            end = match.end()
        if out and end < len(text):
            out[-1] += text[end:]
        return out

    def decode(self, ids: list[int]) -> str | None:
        return None  # ids are hashes: the text cannot be recovered

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in _PIECE.findall(text):
            for i in range(-(-len(piece) // _CHARS_PER_TOKEN)):
                chunk = piece[i * _CHARS_PER_TOKEN : (i + 1) * _CHARS_PER_TOKEN]
                ids.append(zlib.crc32(chunk.encode()) % self.vocab_size)
        return ids


class HfTokenizer:
    """A model's own `tokenizer.json`, without special tokens added (the template has them)."""

    approximate = False

    def __init__(self, path: Path, chat_family: str = "generic") -> None:
        from tokenizers import Tokenizer as _Tokenizer

        try:
            self._tok = _Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on a bad file
            raise InferplaneError(
                f"cannot load the tokenizer: {exc}", field="tokenizer.json", value=str(path),
                fix="restore the file from the checkpoint or remove it (counts become "
                    "approximate)",
            ) from None
        self.chat_family = chat_family

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def pieces(self, text: str) -> list[str]:
        """Each token's span of `text`, with the gap before it (so they join to `text`)."""
        encoding = self._tok.encode(text, add_special_tokens=False)
        out: list[str] = []
        done = 0
        for _, end in encoding.offsets:
            out.append(text[done:end] if end > done else "")
            done = max(done, end)
        if out and done < len(text):
            out[-1] += text[done:]
        return out

    def decode(self, ids: list[int]) -> str | None:
        return str(self._tok.decode(ids, skip_special_tokens=False))


def chat_family_of(model_dir: Path) -> str:
    """Which template family tokenizer_config.json's chat_template belongs to."""
    config_path = model_dir / "tokenizer_config.json"
    if not config_path.is_file():
        return "generic"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "generic"
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        template = " ".join(str(t.get("template", "")) for t in template if isinstance(t, dict))
    if not isinstance(template, str):
        return "generic"
    if "<|im_start|>" in template:
        return "chatml"
    if "<|start_header_id|>" in template:
        return "llama3"
    return "generic"


def load_tokenizer(model_dir: Path | None, vocab_size: int) -> Tokenizer:
    """The directory's tokenizer.json when present, else the documented approximation."""
    if model_dir is not None and (model_dir / "tokenizer.json").is_file():
        return HfTokenizer(model_dir / "tokenizer.json", chat_family_of(model_dir))
    return ApproxTokenizer(vocab_size)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts; only text parts carry tokens here
        return "".join(
            str(part.get("text", "")) for part in content if isinstance(part, dict)
        )
    return ""


def render_chat(family: str, messages: Sequence[dict[str, Any]]) -> str:
    """The prompt text of `messages` in the template family, with the generation prompt."""
    parts: list[str] = []
    for message in messages:
        role = str(message.get("role", "user"))
        content = _content_text(message.get("content"))
        if family == "chatml":
            parts.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
        elif family == "llama3":
            parts.append(f"<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>")
        else:
            parts.append(f"<|{role}|>\n{content}\n")
    if family == "chatml":
        return "".join(parts) + "<|im_start|>assistant\n"
    if family == "llama3":
        return "<|begin_of_text|>" + "".join(parts) + (
            "<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(parts) + "<|assistant|>\n"


def chat_prompt_ids(tokenizer: Tokenizer, messages: Sequence[dict[str, Any]]) -> list[int]:
    """Token ids of a chat rendered roughly as its template family would (`render_chat`)."""
    return tokenizer.encode(render_chat(tokenizer.chat_family, messages))


def filler_piece(index: int, *, first: bool = False) -> str:
    """Text of filler word number `index`; the first token of an output has no space."""
    word = FILLER_WORDS[index % len(FILLER_WORDS)]
    return word.lstrip() if first else word


def filler_text(count: int) -> str:
    return "".join(filler_piece(i, first=i == 0) for i in range(count))


def apply_stop(count: int, stop: Sequence[str]) -> tuple[int, str | None]:
    """Tokens to generate before a stop string completes, and which stop matched."""
    if not stop:
        return count, None
    text = ""
    for i in range(count):
        text += filler_piece(i, first=i == 0)
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
