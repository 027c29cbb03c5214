"""Decide whether a checkpoint is served for generation or as an embedding model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inferplane.models.profile import Task

# Files sentence-transformers writes next to an embedding checkpoint.
SENTENCE_TRANSFORMERS_FILES = ("modules.json", "config_sentence_transformers.json")
# Encoder-only families: no causal LM head, vLLM serves them for pooling.
_ENCODER_TYPES = frozenset(
    {"bert", "roberta", "xlm-roberta", "distilbert", "mpnet", "nomic_bert", "modernbert",
     "new", "electra", "deberta-v2"}
)


def default_task(config: dict[str, Any], *, name: str, model_dir: Path | None) -> Task:
    if model_dir is not None and any((model_dir / f).is_file()
                                     for f in SENTENCE_TRANSFORMERS_FILES):
        return "embed"
    architectures = [str(a) for a in config.get("architectures") or []]
    if any("Embedding" in a for a in architectures) or "embedding" in name.lower():
        return "embed"
    if str(config.get("model_type", "")) in _ENCODER_TYPES:
        return "embed"
    # A bare `XxxModel` (no ForCausalLM head) is an encoder/pooling checkpoint.
    if architectures and all(a.endswith("Model") for a in architectures):
        return "embed"
    return "generate"
