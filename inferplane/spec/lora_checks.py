"""Checks of `models[].lora.adapters` against the files: each adapter directory is a PEFT
LoRA adapter vLLM will load on this base (the checks vLLM makes at load time, made before
anything starts).

- the files: `adapter_config.json` and a weights file (inferplane.models.peft);
- the rank: `r` (and `rank_pattern`) at most `max_lora_rank` (vLLM: "LoRA rank N is
  greater than max_lora_rank M");
- the target modules: every module the weights file holds exists in the base (vLLM:
  "expected target modules in [...] but received [...]"). The base's modules are its
  checkpoint's linear layers when the weights are local, else the standard decoder names
  (q/k/v/o_proj, gate/up/down_proj, the MoE router and experts); embed_tokens and lm_head
  only for the architectures whose vLLM class wraps them;
- the base model: `base_model_name_or_path` names the same model as the base's `source`.
  Lenient on form: a local path, a Hugging Face id and a Hugging Face cache snapshot path
  compare by the model's name (the last path part; `org--name` and `models--org--name`
  count as `name`), case-insensitive, also against the base's config `_name_or_path`; an
  adapter that records no base is not checked;
- the features vLLM refuses (DoRA, LoRA bias, modules_to_save).
"""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from inferplane.errors import InferplaneError
from inferplane.estimator.lora import EMBEDDING_LORA_ARCHITECTURES
from inferplane.models.peft import PeftAdapter, read_adapter
from inferplane.models.safetensors_reader import checkpoint_files, read_header
from inferplane.spec.lora import VLLM_LORA_RANKS
from inferplane.spec.problems import Issue

if TYPE_CHECKING:
    from inferplane.spec.fleet import FleetSpec
    from inferplane.spec.model import ModelSpec

DECODER_MODULES = frozenset(
    {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
MOE_MODULES = frozenset({"gate", "w1", "w2", "w3"})  # the router; Mixtral-style experts
EMBEDDING_MODULES = frozenset({"embed_tokens", "lm_head"})
_LAYER_WEIGHT = re.compile(r"\.layers\.\d+\.(?:.*\.)?([A-Za-z0-9_]+)\.weight$")


def lora_file_issues(fleet: FleetSpec) -> list[Issue]:
    issues: list[Issue] = []
    for index, model in enumerate(fleet.models):
        if model.lora is None or model.is_endpoint:
            continue
        base = _BaseModel.read(model)
        for position, adapter in enumerate(model.lora.adapters):
            loc = ("models", index, "lora", "adapters", position, "source")
            try:
                peft = read_adapter(Path(adapter.source))
            except InferplaneError as exc:
                issues.append(Issue(loc, exc.message, adapter.source, exc.fix))
                continue
            issues += _adapter_issues(peft, model, base, loc, index)
    return issues


def same_model(recorded: str, names: list[str]) -> bool:
    """Whether `recorded` (base_model_name_or_path) names one of `names` (see the module
    docstring for the rule)."""
    key = model_key(recorded)
    return not key or any(model_key(name) == key for name in names if name)


def model_key(name: str) -> str:
    """The model's name in a path, a Hugging Face id or a cache snapshot path, lowercased."""
    parts = [p for p in PurePosixPath(name.strip().rstrip("/")).parts if p not in ("/", ".")]
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        parts = [parts[-3]]
    if not parts:
        return ""
    return parts[-1].rsplit("--", 1)[-1].lower()


class _BaseModel:
    """What the checks need to know of the base: its names and its LoRA-able modules."""

    def __init__(self, names: list[str], modules: frozenset[str] | None) -> None:
        self.names = names
        self.modules = modules  # None: unknown (a Hugging Face id not on this host)

    @classmethod
    def read(cls, model: ModelSpec) -> _BaseModel:
        source = model.source or ""
        directory = Path(source)
        config = _config(directory)
        if config is None:
            return cls([source], None)
        names = [source, str(config.get("_name_or_path") or "")]
        archs = config.get("architectures") or []
        arch = str(archs[0]) if archs else ""
        modules = _checkpoint_modules(directory) or set(DECODER_MODULES)
        if _is_moe(config):
            modules |= MOE_MODULES | DECODER_MODULES
        if arch in EMBEDDING_LORA_ARCHITECTURES:
            modules |= EMBEDDING_MODULES
        return cls(names, frozenset(modules))


def _adapter_issues(peft: PeftAdapter, model: ModelSpec, base: _BaseModel,
                    loc: tuple[str | int, ...], index: int) -> list[Issue]:
    assert model.lora is not None
    issues: list[Issue] = []
    where = f"models[{index}].lora.max_lora_rank"
    if peft.rank > model.lora.max_lora_rank:
        need = next((r for r in VLLM_LORA_RANKS if r >= peft.rank), None)
        issues.append(Issue(
            loc, f"adapter rank {peft.rank} is above max_lora_rank "
            f"{model.lora.max_lora_rank} (vLLM refuses to load it)", str(peft.path),
            f"set {where} to {need}" if need else
            f"the adapter's rank exceeds vLLM's largest ({VLLM_LORA_RANKS[-1]}); retrain "
            "it with a lower r",
        ))
    for feature in peft.unsupported:
        issues.append(Issue(loc, f"vLLM does not serve adapters with {feature}",
                            str(peft.path), "retrain without it, or merge the adapter into "
                            "the weights and serve the result as its own model"))
    if base.modules is not None:
        unknown = [m for m in peft.modules if m not in base.modules]
        if unknown:
            issues.append(Issue(
                loc, f"adapter targets modules the base model does not have (or vLLM "
                f"does not give LoRA to on it): {', '.join(unknown)}", str(peft.path),
                f"use an adapter trained on {model.source} (its modules: "
                f"{', '.join(sorted(base.modules))})",
            ))
    if peft.base_model is not None and not same_model(peft.base_model, base.names):
        issues.append(Issue(
            loc, f"adapter was trained on {peft.base_model!r}, not on this model's source "
            f"{model.source!r}", str(peft.path),
            f"serve it under the model whose source is {peft.base_model}, or, if this base "
            "is that model (a renamed copy), set base_model_name_or_path in "
            "adapter_config.json to it",
        ))
    return issues


def _config(directory: Path) -> dict[str, Any] | None:
    file = directory / "config.json"
    if not file.is_file():
        return None
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # the planner reports an unreadable base config
    return data if isinstance(data, dict) else None


def _is_moe(config: dict[str, Any]) -> bool:
    keys = ("num_experts", "num_local_experts", "n_routed_experts")
    return any(int(config.get(k) or 0) > 0 for k in keys)


def _checkpoint_modules(directory: Path) -> set[str]:
    """Names of the base's per-layer 2-D weights (its linear layers), from the headers."""
    out: set[str] = set()
    try:
        for file in checkpoint_files(directory):
            for tensor in read_header(file):
                match = _LAYER_WEIGHT.search(tensor.name)
                if match and len(tensor.shape) >= 2 and "norm" not in match.group(1):
                    out.add(match.group(1))
    except InferplaneError:
        return set()  # unreadable weights: the planner reports them
    return out
