"""Where a model comes from: a local directory, a Hugging Face id, or remote endpoints."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic_core import PydanticCustomError

_HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_EXPLICIT_PATH_PREFIXES = ("/", "./", "../", "~")


def is_hf_id(source: str) -> bool:
    return bool(_HF_ID.match(source))


def resolve_source(source: str, base_dir: Path | None) -> str:
    """An absolute, normalised local path, or the Hugging Face id unchanged.

    Paths starting with `/`, `./`, `../` or `~` are always local; `org/name` is a Hugging Face
    id unless a directory of that name exists next to the fleet file. Relative paths resolve
    against the fleet file's directory. Symlinks are kept: the path is the model's identity
    (P29: versioned directories).
    """
    text = source.strip()
    if not text:
        raise PydanticCustomError(
            "source_empty", "source is empty", {"fix": "give a model directory or an org/name id"}
        )
    base = base_dir if base_dir is not None else Path.cwd()
    if text.startswith(_EXPLICIT_PATH_PREFIXES):
        return _absolute(text, base)
    if is_hf_id(text) and not (base / text).is_dir():
        return text
    if (base / text).is_dir():
        return _absolute(text, base)
    raise PydanticCustomError(
        "source_form",
        "source is neither a Hugging Face id (org/name) nor an existing directory",
        {"fix": "write a path as ./dir or /abs/dir, or a Hugging Face id such as Qwen/Qwen3-8B"},
    )


def _absolute(text: str, base: Path) -> str:
    path = Path(text).expanduser()
    if not path.is_absolute():
        path = base / path
    return os.path.normpath(path)


def validate_endpoint(url: Any) -> str:
    """An http(s) base URL of an OpenAI-compatible server, without a trailing slash."""
    if not isinstance(url, str):
        raise PydanticCustomError(
            "endpoint_type",
            "endpoint must be a URL string",
            {"fix": 'quote it: "http://host:8000"'},
        )
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PydanticCustomError(
            "endpoint_url",
            "endpoint is not an http(s) URL with a host",
            {"fix": "write the server's base URL, e.g. http://10.0.0.5:8000"},
        )
    try:
        _ = parts.port  # raises on a non-numeric or out-of-range port
    except ValueError as exc:
        raise PydanticCustomError(
            "endpoint_port", "endpoint port is not a number in 1-65535", {"fix": "e.g. :8000"}
        ) from exc
    if parts.query or parts.fragment:
        raise PydanticCustomError(
            "endpoint_query",
            "endpoint must not have a query or fragment",
            {"fix": "give only scheme://host:port and an optional path prefix"},
        )
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        # The gateway appends /v1/...; keeping /v1 here would request /v1/v1/chat/completions.
        raise PydanticCustomError(
            "endpoint_v1",
            "endpoint must not end with /v1",
            {"fix": f"drop /v1: {url.strip().rstrip('/')[: -len('/v1')]}"},
        )
    return f"{parts.scheme}://{parts.netloc}{path}"


def missing_source_error(model: str, source: str) -> Exception:
    """A model's `source` that is no local directory (a typo, or a Hugging Face id: inferplane
    never downloads): the model, the field and how to get the one file sizing needs."""
    from inferplane.errors import InferplaneError

    field = f"models.{model}.source"
    if is_hf_id(source):
        target = source.replace("/", "--")
        return InferplaneError(
            "a Hugging Face id, not a local directory: sizing reads its config.json and "
            "inferplane never downloads", field=field, value=source,
            fix=f"fetch only that file: `huggingface-cli download {source} config.json "
            f"--local-dir models/{target}`, then set source: ./models/{target}",
        )
    return InferplaneError(
        "no such directory", field=field, value=source,
        fix="point source at the local model directory holding config.json "
        "(`inferplane validate` lists every problem with its line)",
    )
