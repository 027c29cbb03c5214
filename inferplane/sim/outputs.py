"""What one simulated choice "generates": the text of each token, and its logprobs.

Plain requests generate filler (`tokens.filler_piece`), choice `i` starting `i` words into
the rotation so `n` choices differ. Structured outputs and forced tool calls generate the
JSON text of `schema.instance_for`, split into word and punctuation tokens. Logprobs are
those of a greedy sampler: the generated token is the most likely one, its logprob a
deterministic value in [-0.7, -0.01]; the alternatives share the remaining probability mass
in halving steps, so the top list is sorted, distinct and sums to less than 1.
"""

from __future__ import annotations

import itertools
import math
import re
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from inferplane.sim.tokens import FILLER_WORDS, filler_piece

_JSON_PIECE = re.compile(r"\s*(?:\w+|[^\w\s])")
# Alternatives offered in top_logprobs (the generated token is skipped when it is one).
_ALTERNATIVES: tuple[str, ...] = (
    *FILLER_WORDS, " the", " a", " of", " and", " to", " in", " is", ",", ".", "\n",
    " it", " that", " for", " on", " with", " as", " was", " at", " by", " be", " this",
)


@dataclass(frozen=True)
class Output:
    """The tokens of one choice. `stop` is the matched stop string (cut from the text)."""

    pieces: tuple[str, ...]
    finish_reason: str
    stop: str | None = None

    @cached_property
    def ends(self) -> tuple[int, ...]:
        """Character offset where each token ends (streams index it once per token)."""
        return tuple(itertools.accumulate(len(p) for p in self.pieces))

    @cached_property
    def text(self) -> str:
        text = "".join(self.pieces)
        if self.stop is not None and self.stop in text:
            text = text[: text.index(self.stop)]
        return text

    def offset(self, count: int) -> int:
        """Characters in the first `count` tokens."""
        return self.ends[count - 1] if count > 0 else 0

    def visible(self, count: int) -> str:
        """The text a client has seen after `count` tokens (a stop string never shows)."""
        return self.text[: self.offset(count)]


def json_pieces(text: str) -> tuple[str, ...]:
    """Word and punctuation tokens of a JSON text (they join back to `text`)."""
    pieces = tuple(_JSON_PIECE.findall(text))
    return pieces if "".join(pieces) == text else tuple(text)


def filler_output(
    choice: int, count: int, stop: Sequence[str], finish_reason: str
) -> Output:
    """`count` filler tokens, cut after the first stop string that completes."""
    pieces = [filler_piece(choice + i, first=i == 0) for i in range(count)]
    cut, matched = _apply_stop(pieces, stop)
    return Output(tuple(pieces[:cut]), "stop" if matched else finish_reason, matched)


def fixed_output(pieces: tuple[str, ...], max_tokens: int, stop: Sequence[str]) -> Output:
    """A forced text (JSON): it ends by itself ("stop") unless max_tokens cuts it ("length")."""
    finish = "stop"
    if len(pieces) > max_tokens:
        pieces, finish = pieces[:max_tokens], "length"
    cut, matched = _apply_stop(list(pieces), stop)
    return Output(pieces[:cut], "stop" if matched else finish, matched)


def _apply_stop(pieces: list[str], stop: Sequence[str]) -> tuple[int, str | None]:
    if not stop:
        return len(pieces), None
    text = ""
    for i, piece in enumerate(pieces):
        text += piece
        for s in stop:
            if s and s in text:
                return i + 1, s
    return len(pieces), None


# -- logprobs -----------------------------------------------------------------------------


def top_logprobs(piece: str, position: int, k: int) -> list[tuple[str, float]]:
    """The `max(k, 1)` most likely tokens at `position`, the generated `piece` first."""
    seed = zlib.crc32(f"{position}:{piece}".encode())
    chosen = -round(0.01 + (seed % 691) / 1000, 3)  # in [-0.7, -0.01]: p >= 0.5
    rest = 1.0 - math.exp(chosen)
    out = [(piece, chosen)]
    alternatives = [a for a in _ALTERNATIVES if a != piece]
    for j in range(max(k, 1) - 1):
        token = alternatives[j] if j < len(alternatives) else f" alt{j}"
        out.append((token, round(math.log(rest) - (j + 1) * math.log(2), 6)))
    return out


def _entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def chat_logprobs(pieces: Sequence[str], start: int, k: int) -> dict[str, Any]:
    """vLLM's ChatCompletionLogProbs for tokens `start`.. of a choice."""
    content = []
    for offset, piece in enumerate(pieces):
        top = top_logprobs(piece, start + offset, k)
        item = _entry(*top[0])
        item["top_logprobs"] = [_entry(t, lp) for t, lp in top[:k]] if k else []
        content.append(item)
    return {"content": content}


@dataclass(frozen=True)
class PromptToken:
    """A prompt token in an echoed completion: its text; the first has no logprob."""

    text: str


def completion_logprobs(
    tokens: Sequence[str | PromptToken], start: int, k: int, text_offset: int
) -> dict[str, Any]:
    """vLLM's CompletionLogProbs (tokens, token_logprobs, top_logprobs, text_offset).

    `tokens` may begin with echoed prompt tokens: the first of them has no logprob (None),
    as in vLLM's prompt_logprobs; the rest are scored like generated ones.
    """
    out_tokens: list[str] = []
    logprobs: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    offset = text_offset
    for i, token in enumerate(tokens):
        text = token.text if isinstance(token, PromptToken) else token
        offsets.append(offset)
        out_tokens.append(text)
        if isinstance(token, PromptToken) and start + i == 0:
            logprobs.append(None)
            tops.append(None)
        else:
            top = top_logprobs(text, start + i, k)
            logprobs.append(top[0][1])
            tops.append(dict(top))
        offset += len(text)
    return {"text_offset": offsets, "token_logprobs": logprobs, "tokens": out_tokens,
            "top_logprobs": tops}


def prompt_logprobs(
    ids: Sequence[int],
    pieces: Sequence[str] | None,
    k: int,
    encode: Callable[[str], list[int]],
) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's `prompt_logprobs`: None for the first token, then per token a dict of token id
    to `{logprob, rank, decoded_token}` holding the prompt's own token (rank 1, as the
    greedy simulated model ranks it) and the `k` most likely others (their ids from the
    tokenizer; `decoded_token` is None where the text of a token-id prompt is unknown)."""
    out: list[dict[str, dict[str, Any]] | None] = [None] if ids else []
    for i in range(1, len(ids)):
        piece = pieces[i] if pieces is not None else None
        top = top_logprobs(piece if piece is not None else f"token_id:{ids[i]}", i, k + 1)
        entry = {str(ids[i]): {"logprob": top[0][1], "rank": 1, "decoded_token": piece}}
        for rank, (token, logprob) in enumerate(top[1:], start=2):
            encoded = encode(token)
            if encoded and str(encoded[0]) not in entry:
                entry[str(encoded[0])] = {"logprob": logprob, "rank": rank,
                                          "decoded_token": token}
        out.append(entry)
    return out
