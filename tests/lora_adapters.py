"""PEFT adapters for tests, written by scripts/make_tiny_adapter.py (pure Python, no torch)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "tests" / "data" / "models"


def maker() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "make_tiny_adapter", ROOT / "scripts" / "make_tiny_adapter.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_adapter(out: Path, base: str | Path, *, rank: int = 8,
                 targets: tuple[str, ...] = ("q_proj", "v_proj"), zeros: bool = True,
                 base_name: str | None = None, config: dict[str, Any] | None = None) -> Path:
    """An adapter for `base` (a tests/data/models folder name or a directory); `config`
    entries overwrite adapter_config.json afterwards (to make a broken adapter)."""
    base_dir = base if isinstance(base, Path) else MODELS / base
    path: Path = maker().write_adapter(out, base_dir, rank=rank, targets=targets, zeros=zeros,
                                       base_name=base_name or str(base_dir))
    if config:
        file = path / "adapter_config.json"
        data = json.loads(file.read_text())
        data.update(config)
        file.write_text(json.dumps(data))
    return path
