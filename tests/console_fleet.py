"""The fleet the console tests look at, with and without a browser: two L40S cards on the
simulator, two replicas of `chat` and one embedding model sharing card 1."""

from __future__ import annotations

from pathlib import Path

MODELS = Path(__file__).parent / "data" / "models"


def console_fleet(embed_name: str, embed_keys: str = "", extra: str = "") -> str:
    """The fleet's YAML; `embed_keys` (indented lines) go into the embedding model's entry,
    `extra` (top-level keys: gateway, routes) after `models:`."""
    return f"""\
engine: sim
gpus:
  nodes:
    - {{name: n1, gpu_type: L40S, count: 2}}
models:
  - name: chat
    source: {MODELS / "Qwen--Qwen3-8B"}
    max_model_len: 4096
    max_num_seqs: 8
    replicas: 2
  - name: {embed_name}
    source: {MODELS / "Qwen--Qwen3-Embedding-0.6B"}
{embed_keys}    max_model_len: 2048
    max_num_seqs: 8
{extra}"""
