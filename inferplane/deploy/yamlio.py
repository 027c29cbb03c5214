"""Deterministic YAML output and atomic file writes."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml


class _Dumper(yaml.SafeDumper):
    """SafeDumper that writes multi-line strings as literal blocks (readable scripts)."""


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    if "\n" in data and not any(line != line.rstrip() for line in data.splitlines()):
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_Dumper.add_representer(str, _str)


def dump_docs(docs: Iterable[dict[str, Any]]) -> str:
    """YAML documents with sorted keys, block style, no anchors: byte-identical per input."""
    parts = [
        yaml.dump(doc, Dumper=_Dumper, sort_keys=True, default_flow_style=False, width=1000)
        for doc in docs
    ]
    return "---\n".join(parts)


def write_atomic(path: Path, text: str) -> None:
    """Write `text` as UTF-8 (newlines as given) atomically, as `write_atomic_bytes`."""
    write_atomic_bytes(path, text.encode("utf-8"))


def write_atomic_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same directory, then rename over `path`: a reader
    sees the old file or the new one, never part of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_docs(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]
