"""GPU type names in the fleet file, checked against the GPU catalog when it is available.

The catalog (`inferplane.gpus.lookup_gpu`) is another package's job; the spec uses it when
importable so a typo such as `L40` fails at validate time with the catalog's own suggestion,
and otherwise only requires a non-empty name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from pydantic_core import PydanticCustomError

from inferplane.errors import InferplaneError

_CATALOG_FIX = "use a GPU name from the catalog, e.g. L40S, A100-80GB, H100, H200"


def _catalog_lookup() -> Callable[[str], Any] | None:
    try:
        module = importlib.import_module("inferplane.gpus")
    except ImportError:
        return None
    lookup = getattr(module, "lookup_gpu", None)
    return lookup if callable(lookup) else None


def nearest_gpu_names(name: str) -> list[str]:
    try:
        module = importlib.import_module("inferplane.gpus.catalog")
    except ImportError:
        return []
    near = getattr(module, "nearest_gpu_names", None)
    return list(near(name)) if callable(near) else []


def canonical_gpu_type(name: str) -> str:
    """The catalog's canonical name for `name` (e.g. `h100` -> `H100-SXM-80GB`)."""
    if not name.strip():
        raise PydanticCustomError(
            "gpu_type_empty", "GPU type is empty", {"fix": "name a GPU model, e.g. L40S or H100"}
        )
    lookup = _catalog_lookup()
    if lookup is None:
        return name.strip()
    try:
        gpu = lookup(name)
    except (InferplaneError, KeyError, ValueError) as exc:
        message = str(getattr(exc, "message", "unknown GPU type"))
        near = nearest_gpu_names(name) if "ambiguous" not in message else []
        # The catalog's fix for ambiguous names ("name the exact model …") fits here too;
        # its fix for unknown names talks about CLI flags, so use ours.
        fix = getattr(exc, "fix", None) if "ambiguous" in message else None
        if near:  # the nearest names, not four unrelated examples
            message, fix = "unknown GPU type", f"did you mean {' or '.join(near)}?"
        raise PydanticCustomError(
            "gpu_type_unknown", "{message}", {"message": message, "fix": fix or _CATALOG_FIX}
        ) from exc
    if gpu is None:
        raise PydanticCustomError(
            "gpu_type_unknown",
            "unknown GPU type",
            {"fix": _CATALOG_FIX},
        )
    return str(getattr(gpu, "name", name))
