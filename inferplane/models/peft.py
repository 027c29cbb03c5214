"""Read a PEFT LoRA adapter directory: `adapter_config.json` and the tensor names and shapes
of `adapter_model.safetensors` (its header only, never the weights).

What vLLM itself reads (vllm/lora/peft_helper.py, lora_model.py, v0.32): the rank `r` (and
`rank_pattern`), `lora_alpha`, `target_modules`, the unsupported features it refuses (DoRA,
bias, `modules_to_save` other than classifier heads) and, as the truth for which modules
the adapter touches, the tensor names in the weights file.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferplane.errors import InferplaneError
from inferplane.models.safetensors_reader import read_header

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
OTHER_WEIGHTS_FILES = ("adapter_model.bin", "adapter_model.pt")  # vLLM loads them with torch
_LORA_SUFFIX = re.compile(r"\.(?:lora_A|lora_B)(?:\.[^.]+)?\.weight$|\.lora_embedding_[AB]$")
_EXPERT = re.compile(r"\.experts\.\d+\.")


@dataclass(frozen=True)
class PeftAdapter:
    """What an adapter directory says about itself."""

    path: Path
    rank: int  # the largest rank of any module (r, or more in rank_pattern)
    lora_alpha: float
    target_modules: tuple[str, ...] | str  # a list, or PEFT's regex / "all-linear" string
    base_model: str | None  # base_model_name_or_path
    weights_file: Path
    modules: tuple[str, ...]  # module names the weights file holds (q_proj, ...), sorted
    expert_modules: bool  # some tensors are per-expert (MoE) LoRA weights
    unsupported: tuple[str, ...]  # features vLLM refuses, in words


def read_adapter(path: Path) -> PeftAdapter:
    """The adapter in directory `path`; raises InferplaneError naming the missing piece."""
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is not a directory"
        raise InferplaneError(
            f"adapter directory {what}", value=str(path),
            fix="point source at a PEFT adapter directory (adapter_config.json + "
                "adapter_model.safetensors), e.g. the output_dir of the fine-tuning run",
        )
    config = _read_config(path / CONFIG_FILE)
    weights = path / WEIGHTS_FILE
    if weights.is_file():
        names = [t.name for t in read_header(weights)]
        modules = sorted({module_name(n) for n in names if _LORA_SUFFIX.search(n)})
        experts = any(_EXPERT.search(n) for n in names)
    else:
        other = next((path / f for f in OTHER_WEIGHTS_FILES if (path / f).is_file()), None)
        if other is None:
            raise InferplaneError(
                f"adapter has no weights file ({WEIGHTS_FILE})", value=str(path),
                fix="copy adapter_model.safetensors into the directory (PEFT's "
                    "save_pretrained writes it)",
            )
        weights, modules, experts = other, [], False
    return PeftAdapter(
        path=path, rank=_rank(config, path), lora_alpha=float(config["lora_alpha"]),
        target_modules=_targets(config["target_modules"]),
        base_model=_text(config.get("base_model_name_or_path")),
        weights_file=weights, modules=tuple(modules), expert_modules=experts,
        unsupported=tuple(_unsupported(config)),
    )


def module_name(tensor: str) -> str:
    """`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight` -> `q_proj`."""
    return _LORA_SUFFIX.sub("", tensor).rsplit(".", 1)[-1]


def _read_config(file: Path) -> dict[str, Any]:
    fix = "restore adapter_config.json from the fine-tuning output (PEFT writes it)"
    if not file.is_file():
        raise InferplaneError("adapter has no adapter_config.json", value=str(file.parent),
                              fix=fix)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InferplaneError(f"adapter_config.json cannot be read: {exc}", value=str(file),
                              fix=fix) from None
    if not isinstance(data, dict):
        raise InferplaneError("adapter_config.json is not a JSON object", value=str(file),
                              fix=fix)
    peft_type = data.get("peft_type", "LORA")
    if str(peft_type).upper() != "LORA":
        raise InferplaneError(
            f"adapter is a {peft_type} adapter; vLLM serves LoRA adapters only",
            value=str(file), fix="train a LoRA adapter (peft.LoraConfig)",
        )
    missing = [k for k in ("r", "lora_alpha", "target_modules") if k not in data]
    if missing:
        raise InferplaneError(f"adapter_config.json lacks {', '.join(missing)}",
                              value=str(file), fix=fix)
    return data


def _rank(config: dict[str, Any], path: Path) -> int:
    ranks = [config["r"], *dict(config.get("rank_pattern") or {}).values()]
    if not all(isinstance(r, int) and not isinstance(r, bool) and r > 0 for r in ranks):
        raise InferplaneError("adapter_config.json has a rank that is not a positive integer",
                              value=str(ranks), location=str(path / CONFIG_FILE),
                              fix="r and every rank_pattern value must be positive integers")
    return max(ranks)


def _targets(value: Any) -> tuple[str, ...] | str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return tuple(str(v) for v in value)
    return ()


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def _unsupported(config: dict[str, Any]) -> list[str]:
    """The features vLLM's PEFTHelper refuses (validate_legal)."""
    out: list[str] = []
    if config.get("use_dora"):
        out.append("DoRA (use_dora)")
    if config.get("bias", "none") != "none" or config.get("lora_bias"):
        out.append(f"LoRA bias (bias: {config.get('bias')!r})")
    saved = [m for m in config.get("modules_to_save") or [] if m not in ("classifier", "score")]
    if saved:
        out.append(f"modules_to_save {saved}")
    return out
