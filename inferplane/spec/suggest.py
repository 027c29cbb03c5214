"""'Did you mean …?' for misspelt keys and names."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The closest choice, comparing `-` and `_` alike and ignoring case; None if none is close."""
    options = list(choices)
    by_key = {_key(option): option for option in options}
    exact = by_key.get(_key(word))
    if exact is not None:
        return exact
    match = difflib.get_close_matches(_key(word), list(by_key), n=1, cutoff=0.6)
    return by_key[match[0]] if match else None


def _key(text: str) -> str:
    return text.lower().replace("-", "_")


def did_you_mean(word: str, choices: Iterable[str], *, noun: str = "") -> str:
    """A fix sentence: "did you mean 'x'?" or the list of valid choices."""
    options = sorted(choices)
    match = closest(word, options)
    if match is not None:
        return f"did you mean {match!r}?"
    label = f"valid {noun}s" if noun else "valid choices"
    return f"{label}: {', '.join(options)}" if options else f"there are no {noun or 'choice'}s"
