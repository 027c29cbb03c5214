"""Reading Hugging Face JSON files of a model directory, and the text part of a config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from inferplane.errors import InferplaneError
from inferplane.models.defaults import with_defaults

CONFIG_FILE = "config.json"
# Top-level keys that describe the whole checkpoint, not one sub-model.
_CHECKPOINT_KEYS = ("torch_dtype", "dtype", "quantization_config", "architectures")


def read_json_object(path: Path, *, what: str, fix: str) -> dict[str, Any]:
    """Parse `path` as a JSON object; any failure is an InferplaneError naming the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise InferplaneError(f"{what} not found", location=str(path), fix=fix) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise InferplaneError(
            f"{what} cannot be read: {exc}", location=str(path), fix=fix
        ) from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InferplaneError(
            f"{what} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
            location=str(path),
            fix=fix,
        ) from exc
    if not isinstance(data, dict):
        raise InferplaneError(f"{what} must hold a JSON object", value=type(data).__name__,
                              location=str(path), fix=fix)
    return data


def resolve_config_path(path: Path) -> Path:
    """Accept a model directory or a config.json path; return the config.json path."""
    if path.is_dir():
        return path / CONFIG_FILE
    if path.exists() or path.suffix == ".json":
        return path
    raise InferplaneError(
        "model path does not exist",
        location=str(path),
        fix="pass a local model directory that contains config.json (download it first)",
    )


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The decoder's config, with transformers' defaults filled in.

    Multimodal wrappers (Gemma-3, Llava, Mistral-3, ...) keep the language model in a nested
    `text_config`; vLLM sizes the KV cache from that part (`get_hf_text_config`).
    """
    nested = config.get("text_config")
    if isinstance(nested, dict):
        merged = dict(nested)
        for key in _CHECKPOINT_KEYS:
            if key in config and key not in merged:
                merged[key] = config[key]
        merged.setdefault("model_type", _text_model_type(config))
        return with_defaults(merged)
    return with_defaults(config)


def _text_model_type(config: dict[str, Any]) -> str:
    # Gemma3Config's text_config is Gemma3TextConfig even when the nested dict omits model_type.
    outer = str(config.get("model_type", ""))
    return f"{outer}_text" if outer == "gemma3" else outer
