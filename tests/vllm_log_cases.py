"""Real published vLLM startup logs (``tests/data/vllm_logs/*.yaml``) as test cases.

Each YAML file holds one startup: where it was published, the model and GPU, the engine
settings (``None`` = vLLM's default) and the verbatim log lines. ``load_cases()`` returns
them with the facts parsed from the log, for the estimator accuracy tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from inferplane.engines.vllm_log import VllmStartupFacts, parse_startup_log

LOG_DIR = Path(__file__).parent / "data" / "vllm_logs"
MODELS_DIR = Path(__file__).parent / "data" / "models"

SETTING_KEYS = (
    "tensor_parallel_size",
    "gpu_memory_utilization",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "dtype",
    "quantization",
    "kv_cache_dtype",
    "enforce_eager",
    "block_size",
)
REQUIRED_KEYS = (
    "source_url",
    "vllm_version",
    "model_id",
    "model_config",
    "gpu",
    "gpu_total_gib",
    "settings",
    "log",
    "notes",
)


@dataclass(frozen=True)
class VllmLogCase:
    """One published vLLM startup and what it printed."""

    case_id: str
    source_url: str
    vllm_version: str | None
    model_id: str
    model_config: str
    gpu: str
    gpu_total_gib: float | None
    settings: dict[str, Any]
    log: str
    notes: str
    entrypoint: str | None
    facts: VllmStartupFacts
    # Settings the source does not state (not vLLM defaults): KV figures can't be compared.
    unknown_settings: tuple[str, ...] = ()

    @property
    def model_dir(self) -> Path:
        """Directory holding the model's ``config.json``.

        ``configs/<org>--<name>`` is relative to ``tests/data/vllm_logs``; any other value
        names a folder under ``tests/data/models``.
        """
        if self.model_config.startswith("configs/"):
            return LOG_DIR / self.model_config
        return MODELS_DIR / self.model_config


def _load_one(path: Path) -> VllmLogCase:
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    missing = [k for k in REQUIRED_KEYS if k not in raw]
    if missing:
        raise ValueError(f"{path}: missing keys {missing}")
    settings = raw["settings"]
    if not isinstance(settings, dict) or set(settings) != set(SETTING_KEYS):
        raise ValueError(f"{path}: settings must have exactly the keys {list(SETTING_KEYS)}")
    total = raw["gpu_total_gib"]
    return VllmLogCase(
        case_id=path.stem,
        source_url=str(raw["source_url"]),
        vllm_version=None if raw["vllm_version"] is None else str(raw["vllm_version"]),
        model_id=str(raw["model_id"]),
        model_config=str(raw["model_config"]),
        gpu=str(raw["gpu"]),
        gpu_total_gib=None if total is None else float(total),
        settings=dict(settings),
        log=str(raw["log"]),
        notes=str(raw["notes"]),
        entrypoint=raw.get("entrypoint"),
        facts=parse_startup_log(str(raw["log"])),
        unknown_settings=tuple(raw.get("unknown_settings") or ()),
    )


def load_cases() -> list[VllmLogCase]:
    """All cases under ``tests/data/vllm_logs``, sorted by case id."""
    return [_load_one(p) for p in sorted(LOG_DIR.glob("*.yaml"))]
