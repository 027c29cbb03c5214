"""What a benchmark sends: prompts with known token counts and output lengths.

Datasets (as in `vllm bench serve`):
  * random: input/output lengths drawn uniformly in [len x (1 - range), len x (1 + range)];
  * sharegpt: a ShareGPT-format JSON file (first human turn = prompt, the reply's length =
    output length, vLLM's filter: prompt and reply >= 4 tokens, prompt <= 1024, sum <= 2048);
  * prefix: `num_prefixes` shared prefixes (system prompts) of `prefix_len` tokens, each
    request one of them plus its own random suffix;
  * trace: a JSONL trace, one request per line: `timestamp` (ms, Mooncake format) or
    `timestamp_s`, `input_length`, `output_length`, optional `hash_ids` (512-token blocks:
    equal ids are equal prompt blocks, so prefix sharing replays too).

Token counts: with a `tokenizer.json` the prompt is built from token ids and counted
exactly; without one, prompts are made of short words that count as one token each under
the simulator's approximation (ceil(len/4) per word) and the counts are marked approximate
(real BPE tokenizers split differently). Server-reported usage, when present, wins.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from inferplane.errors import InferplaneError

TRACE_BLOCK_TOKENS = 512  # Mooncake traces: one hash id per 512 prompt tokens
_SYLLABLES = ("ka", "lo", "mi", "nu", "pe", "ra", "si", "to", "ve", "zu", "bo", "da")


class TextTokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


@dataclass(frozen=True)
class BenchRequest:
    """One request to send. `arrival_s`: offset from the start (trace replay), else None."""

    prompt: str
    prompt_tokens: int
    output_tokens: int
    model: str | None = None
    arrival_s: float | None = None


@dataclass(frozen=True)
class Dataset:
    requests: list[BenchRequest]
    approximate_counts: bool  # True when no tokenizer counted the prompts


class HfTextTokenizer:
    """A local `tokenizer.json` (the `tokenizers` library); never downloads."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise InferplaneError(
                "no tokenizer.json there", field="tokenizer", value=str(path),
                fix="pass a model directory with tokenizer.json, or leave --tokenizer out",
            )
        self._tok = Tokenizer.from_file(str(file))
        self.vocab_size = self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids)))


class _Words:
    """Prompt text of an exact token count: real token ids, or one-token words."""

    def __init__(self, tokenizer: TextTokenizer | None, vocab_size: int = 0) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._words = [a + b for a in _SYLLABLES for b in _SYLLABLES]  # 144 4-char words

    def text(self, tokens: int, rng: random.Random) -> tuple[str, int]:
        if tokens <= 0:
            return "", 0
        if self.tokenizer is None:
            return " ".join(rng.choice(self._words) for _ in range(tokens)), tokens
        # vLLM's random dataset: random ids, decoded, re-encoded to count what is sent.
        low = min(1000, self.vocab_size // 2)
        ids = [rng.randrange(low, max(low + 1, self.vocab_size - 1)) for _ in range(tokens)]
        text = self.tokenizer.decode(ids)
        return text, len(self.tokenizer.encode(text))


def _check_positive(name: str, value: int) -> None:
    if value < 1:
        raise InferplaneError("must be >= 1", field=name, value=value, fix="use a count >= 1")


def _lengths(mean: int, range_ratio: float, count: int, rng: random.Random) -> list[int]:
    if not 0 <= range_ratio < 1:
        raise InferplaneError(
            "must be in [0, 1)", field="range_ratio", value=range_ratio, fix="use e.g. 0.2"
        )
    low = max(1, math.floor(mean * (1 - range_ratio)))
    high = max(low, math.ceil(mean * (1 + range_ratio)))
    return [rng.randint(low, high) for _ in range(count)]


def random_dataset(
    num_requests: int,
    input_len: int,
    output_len: int,
    *,
    range_ratio: float = 0.0,
    seed: int = 0,
    tokenizer: TextTokenizer | None = None,
    vocab_size: int = 0,
) -> Dataset:
    _check_positive("num_requests", num_requests)
    _check_positive("input_len", input_len)
    _check_positive("output_len", output_len)
    rng = random.Random(seed)
    words = _Words(tokenizer, vocab_size)
    ins = _lengths(input_len, range_ratio, num_requests, rng)
    outs = _lengths(output_len, range_ratio, num_requests, rng)
    requests = []
    for n_in, n_out in zip(ins, outs, strict=True):
        text, counted = words.text(n_in, rng)
        requests.append(BenchRequest(text, counted, n_out))
    return Dataset(requests, approximate_counts=tokenizer is None)


def prefix_dataset(
    num_requests: int,
    prefix_len: int,
    suffix_len: int,
    output_len: int,
    *,
    num_prefixes: int = 1,
    seed: int = 0,
    tokenizer: TextTokenizer | None = None,
    vocab_size: int = 0,
) -> Dataset:
    """Shared system prompts (P45): request i uses prefix i mod num_prefixes."""
    for name, value in (("num_requests", num_requests), ("prefix_len", prefix_len),
                        ("suffix_len", suffix_len), ("output_len", output_len),
                        ("num_prefixes", num_prefixes)):
        _check_positive(name, value)
    rng = random.Random(seed)
    words = _Words(tokenizer, vocab_size)
    prefixes = [words.text(prefix_len, rng) for _ in range(num_prefixes)]
    requests = []
    for i in range(num_requests):
        prefix, n_prefix = prefixes[i % num_prefixes]
        suffix, n_suffix = words.text(suffix_len, rng)
        requests.append(BenchRequest(f"{prefix} {suffix}", n_prefix + n_suffix, output_len))
    return Dataset(requests, approximate_counts=tokenizer is None)


def _count(text: str, tokenizer: TextTokenizer | None) -> int:
    if tokenizer is not None:
        return len(tokenizer.encode(text))
    from inferplane.sim.tokens import ApproxTokenizer

    return len(ApproxTokenizer().encode(text))


def sharegpt_dataset(
    path: Path,
    num_requests: int,
    *,
    output_len: int | None = None,
    seed: int = 0,
    tokenizer: TextTokenizer | None = None,
) -> Dataset:
    """ShareGPT JSON: `[{"conversations": [{"from": "human", "value": ...}, {...}]}]`."""
    _check_positive("num_requests", num_requests)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InferplaneError(f"cannot read ShareGPT file: {exc}", location=str(path)) from exc
    if not isinstance(data, list):
        raise InferplaneError("a ShareGPT file is a JSON list of conversations",
                              location=str(path), fix='[{"conversations": [...]}]')
    rng = random.Random(seed)
    order = list(range(len(data)))
    rng.shuffle(order)
    requests: list[BenchRequest] = []
    for index in order:
        turns = data[index].get("conversations") if isinstance(data[index], dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        prompt, reply = str(turns[0].get("value", "")), str(turns[1].get("value", ""))
        n_in = _count(prompt, tokenizer)
        n_out = output_len or _count(reply, tokenizer)
        if n_in < 4 or n_out < 4 or n_in > 1024 or n_in + n_out > 2048:
            continue  # vLLM's filter for ShareGPT
        requests.append(BenchRequest(prompt, n_in, n_out))
        if len(requests) == num_requests:
            break
    if not requests:
        raise InferplaneError("no usable conversation in the file", location=str(path),
                              fix="each needs a human turn and a reply of 4..2048 tokens")
    return Dataset(requests, approximate_counts=tokenizer is None)


def _trace_row(row: Any, where: str) -> tuple[float, int, int, list[int]]:
    if not isinstance(row, dict):
        raise InferplaneError("each line must be a JSON object", location=where)
    try:
        at = (float(row["timestamp_s"]) if "timestamp_s" in row
              else float(row["timestamp"]) / 1000.0)
        n_in, n_out = int(row["input_length"]), int(row["output_length"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InferplaneError(
            f"bad trace row: {exc}", location=where,
            fix='{"timestamp": 0, "input_length": 512, "output_length": 64}',
        ) from exc
    hashes = [int(h) for h in row.get("hash_ids") or []]
    return at, max(1, n_in), max(1, n_out), hashes


def trace_dataset(
    path: Path,
    *,
    num_requests: int | None = None,
    time_scale: float = 1.0,
    tokenizer: TextTokenizer | None = None,
    vocab_size: int = 0,
) -> Dataset:
    """Replay a JSONL trace; `time_scale` < 1 compresses it (0.5 = twice the rate)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InferplaneError(f"cannot read trace: {exc}", location=str(path)) from exc
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise InferplaneError(f"not JSON: {exc}", location=f"{path}:{number}") from exc
        rows.append(_trace_row(row, f"{path}:{number}"))
        if num_requests is not None and len(rows) == num_requests:
            break
    if not rows:
        raise InferplaneError("the trace has no requests", location=str(path))
    start = min(r[0] for r in rows)
    words = _Words(tokenizer, vocab_size)
    blocks: dict[int, tuple[str, int]] = {}
    requests = []
    for i, (at, n_in, n_out, hashes) in enumerate(rows):
        if hashes:
            parts, total = [], 0
            for h in hashes:
                if h not in blocks:
                    blocks[h] = words.text(TRACE_BLOCK_TOKENS, random.Random(h))
                parts.append(blocks[h][0])
                total += blocks[h][1]
            text = " ".join(parts)
            if total > n_in and tokenizer is None:  # last block partial: trim words
                text = " ".join(text.split(" ")[:n_in])
                total = n_in
        else:
            text, total = words.text(n_in, random.Random(1_000_003 + i))
        requests.append(BenchRequest(text, total, n_out, arrival_s=(at - start) * time_scale))
    return Dataset(requests, approximate_counts=tokenizer is None)


def assign_models(
    requests: list[BenchRequest], mix: Sequence[tuple[str, float]], seed: int = 0
) -> list[BenchRequest]:
    """Per-model mix through the gateway: each request gets a model drawn by weight."""
    if not mix:
        return requests
    rng = random.Random(seed)
    names = [m for m, _ in mix]
    weights = [w for _, w in mix]
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        raise InferplaneError("weights must be >= 0 and not all 0", field="mix",
                              value=str(dict(mix)), fix="e.g. --mix a=3,b=1")
    from dataclasses import replace

    return [replace(r, model=rng.choices(names, weights)[0]) for r in requests]
