"""The context length vLLM derives from a config when `--max-model-len` is not given.

Follows `_get_and_verify_max_len` (vllm/config, v0.6 - v0.11 alike):
1. the smallest of the length keys present (`max_position_embeddings`, `n_positions`, ...);
   2048 when none is present;
2. RoPE scaling, unless the type is `su`/`longrope`/`llama3` or the model is Gemma-3 (its
   128K is already scaled): multiply by `factor`; for `yarn` start from
   `original_max_position_embeddings` instead;
3. LongRoPE defaults to the config's top-level `original_max_position_embeddings` (the full
   length must be asked for with `--max-model-len`).
"""

from __future__ import annotations

from typing import Any

# vLLM's `possible_keys`, in its order.
_LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
_DEFAULT_LEN = 2048
_UNSCALED_ROPE_TYPES = ("su", "longrope", "llama3")


def derived_max_model_len(cfg: dict[str, Any]) -> tuple[int, list[str]]:
    """Return (default max_model_len, warnings) for a text config."""
    lengths = [
        v for k in _LENGTH_KEYS
        if isinstance(v := cfg.get(k), int | float) and not isinstance(v, bool)
    ]
    warnings: list[str] = []
    if lengths:
        length: float = min(lengths)
    else:
        length = _DEFAULT_LEN
        warnings.append(
            f"config.json has no context-length key ({', '.join(_LENGTH_KEYS)}); "
            f"vLLM assumes {_DEFAULT_LEN}"
        )
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    model_type = str(cfg.get("model_type", ""))
    if isinstance(rope, dict) and "gemma3" not in model_type:
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type == "longrope":
            # vLLM reads the top-level attribute (Phi-3 style), not the rope dict's.
            original = cfg.get("original_max_position_embeddings")
            return int(original if isinstance(original, int) else length), warnings
        if rope_type not in _UNSCALED_ROPE_TYPES:
            factor = rope.get("factor", 1.0)
            original = rope.get("original_max_position_embeddings")
            if rope_type == "yarn" and isinstance(original, int):
                length = original
            if isinstance(factor, int | float):
                length *= factor
    return int(length), warnings
