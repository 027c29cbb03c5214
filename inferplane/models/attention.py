"""Per-layer attention kind and sliding window, the way vLLM assigns KV-cache specs."""

from __future__ import annotations

from typing import Any

from inferplane.models.arch import TextArch
from inferplane.models.profile import LayerAttention

_LAYER_TYPE_NAMES: dict[str, LayerAttention] = {
    "full_attention": "full",
    "sliding_attention": "sliding",
}


def _same(kind: LayerAttention, n: int) -> tuple[LayerAttention, ...]:
    return (kind,) * n


def layer_attention(
    cfg: dict[str, Any], arch: TextArch
) -> tuple[tuple[LayerAttention, ...], int | None, list[str]]:
    """Return (kind per layer, sliding window or None, warnings)."""
    n = arch.num_layers
    if arch.uses_mla:
        return _same("mla", n), None, []
    window = cfg.get("sliding_window")
    window = window if isinstance(window, int) and window > 0 else None
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and len(layer_types) == n:
        return _from_layer_types(layer_types, window)
    if window is None:
        return _same("full", n), None, []
    model_type = arch.model_type
    if model_type == "gemma2":
        # Gemma2DecoderLayer: even layers slide, odd layers attend globally.
        kinds: tuple[LayerAttention, ...] = tuple(
            "sliding" if i % 2 == 0 else "full" for i in range(n)
        )
        return kinds, window, []
    if model_type == "gemma3_text":
        pattern = int(cfg.get("sliding_window_pattern") or 6)
        # Every `pattern`-th layer is global: 5 sliding + 1 full for the default 6.
        kinds = tuple("full" if (i + 1) % pattern == 0 else "sliding" for i in range(n))
        return kinds, window, []
    if "use_sliding_window" in cfg:
        # Qwen2/Qwen3 keep `sliding_window` set but switched off (Qwen2.5: 131072, false).
        if not cfg.get("use_sliding_window"):
            return _same("full", n), None, []
        first = int(cfg.get("max_window_layers") or 0)
        kinds = tuple("sliding" if i >= first else "full" for i in range(n))
        return kinds, window, []
    # Mistral-style: a set `sliding_window` applies to every layer.
    return _same("sliding", n), window, []


def _from_layer_types(
    layer_types: list[Any], window: int | None
) -> tuple[tuple[LayerAttention, ...], int | None, list[str]]:
    kinds: list[LayerAttention] = []
    unknown: set[str] = set()
    for name in layer_types:
        kind = _LAYER_TYPE_NAMES.get(str(name))
        if kind is None:
            unknown.add(str(name))
            kind = "full"
        if kind == "sliding" and window is None:
            kind = "full"  # a sliding layer without a window attends to everything
        kinds.append(kind)
    warnings = []
    if unknown:
        warnings.append(
            f"layer_types {sorted(unknown)} are not modelled; those layers are treated as full "
            "attention, which over-counts their KV cache"
        )
    has_sliding = "sliding" in kinds
    return tuple(kinds), window if has_sliding else None, warnings
