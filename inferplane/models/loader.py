"""Build a `ModelProfile` from a model directory or from a config dict."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from inferplane.errors import InferplaneError
from inferplane.models.arch import TextArch, build_arch
from inferplane.models.attention import layer_attention
from inferplane.models.context import derived_max_model_len
from inferplane.models.defaults import with_defaults
from inferplane.models.hf_config import read_json_object, resolve_config_path, text_config
from inferplane.models.params import count_gemma3_vision_params, count_text_params
from inferplane.models.profile import ModelProfile, QuantizationInfo
from inferplane.models.quantization import (
    HF_QUANT_CONFIG_FILE,
    from_hf_quant_config,
    from_quantization_config,
)
from inferplane.models.safetensors_reader import checkpoint_files, index_total_size, scan_weights
from inferplane.models.task import default_task

_CONFIG_FIX = "point at a Hugging Face model directory that contains the original config.json"
_DTYPES = ("bfloat16", "float16", "float32")


def profile_from_config(
    config: dict[str, Any], *, name: str, quant_config: dict[str, Any] | None = None
) -> ModelProfile:
    """Profile from a parsed config.json; `quant_config` is a parsed hf_quant_config.json."""
    return _profile(config, name=name, hf_quant=quant_config, model_dir=None, location=name)


def load_profile(path: str | Path, *, name: str | None = None) -> ModelProfile:
    """Profile of a local model directory (or its config.json).

    Reads config.json, hf_quant_config.json and, when weights are present, the safetensors
    headers, which then give exact parameter and byte counts.
    """
    config_path = resolve_config_path(Path(path))
    config = read_json_object(config_path, what="config.json", fix=_CONFIG_FIX)
    model_dir = config_path.parent
    hf_quant = None
    if (model_dir / HF_QUANT_CONFIG_FILE).is_file():
        hf_quant = read_json_object(
            model_dir / HF_QUANT_CONFIG_FILE,
            what=HF_QUANT_CONFIG_FILE,
            fix="restore the file from the checkpoint or delete it",
        )
    profile = _profile(
        config,
        name=name or model_name_from_dir(model_dir),
        hf_quant=hf_quant,
        model_dir=model_dir,
        location=str(config_path),
    )
    return _with_weights(profile, model_dir)


def model_name_from_dir(model_dir: Path) -> str:
    """Directory name, or `org/name` for a Hugging Face cache snapshot directory."""
    resolved = model_dir.resolve()
    parts = resolved.parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        return parts[-3].removeprefix("models--").replace("--", "/")
    return resolved.name


def _profile(
    config: dict[str, Any],
    *,
    name: str,
    hf_quant: dict[str, Any] | None,
    model_dir: Path | None,
    location: str,
) -> ModelProfile:
    cfg = text_config(config)
    arch = build_arch(cfg, location=location)
    warnings: list[str] = []
    if not arch.known:
        warnings.append(
            f"model_type {arch.model_type!r} has no dedicated rule; parameters were counted "
            "as a llama-like decoder (q/k/v/o + gated MLP + 2 norms), which may be off"
        )
    params = count_text_params(arch)
    vision = config.get("vision_config")
    if arch.model_type == "gemma3_text" and isinstance(vision, dict):
        vision_params = count_gemma3_vision_params(with_defaults(vision), arch.hidden_size)
        params = replace(params, other=params.other + vision_params)
        warnings.append(
            f"vision tower and projector ({vision_params:,} params) counted in `other`: "
            "vLLM loads them with the language model"
        )
    kinds, window, attn_warnings = layer_attention(cfg, arch)
    max_len, len_warnings = derived_max_model_len(cfg)
    dtype, dtype_warnings = _torch_dtype(cfg)
    quant, quant_warnings = _quantization(config, hf_quant)
    architectures = config.get("architectures") or []
    return ModelProfile(
        name=name,
        architecture=str(architectures[0]) if architectures else "",
        model_type=arch.model_type,
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_heads,
        num_kv_heads=arch.num_kv_heads,
        head_dim=arch.head_dim,
        vocab_size=arch.vocab_size,
        intermediate_size=_dense_width(arch),
        max_position_embeddings=max_len,
        torch_dtype=dtype,
        tie_word_embeddings=arch.tie_word_embeddings,
        layer_attention=kinds,
        params=params,
        v_head_dim=arch.v_head_dim if arch.v_head_dim != arch.head_dim else None,
        sliding_window=window,
        kv_lora_rank=arch.kv_lora_rank,
        q_lora_rank=arch.q_lora_rank,
        qk_rope_head_dim=arch.qk_rope_head_dim,
        qk_nope_head_dim=arch.qk_nope_head_dim,
        num_experts=arch.num_experts,
        num_experts_per_tok=arch.num_experts_per_tok,
        moe_intermediate_size=arch.moe_intermediate,
        num_shared_experts=arch.num_shared_experts,
        num_moe_layers=sum(arch.moe_layers),
        quantization=quant,
        default_task=default_task(config, name=name, model_dir=model_dir),
        warnings=tuple(warnings + attn_warnings + len_warnings + dtype_warnings + quant_warnings),
    )


def _dense_width(arch: TextArch) -> int:
    return arch.dense_intermediate if not all(arch.moe_layers) or arch.num_layers == 0 else 0


def _torch_dtype(cfg: dict[str, Any]) -> tuple[str, list[str]]:
    # transformers >= 4.56 writes `dtype`; older configs write `torch_dtype`.
    raw = cfg.get("torch_dtype") or cfg.get("dtype")
    if raw is None:
        # vLLM treats a config without a dtype as float32 (served as 16-bit with dtype=auto).
        return "float32", ["config.json has no torch_dtype; vLLM assumes float32"]
    value = str(raw).removeprefix("torch.")
    aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32",
               "float": "float32"}
    value = aliases.get(value, value)
    if value not in _DTYPES:
        raise InferplaneError(
            "unsupported torch_dtype in config.json",
            field="torch_dtype",
            value=raw,
            fix=f"use one of {', '.join(_DTYPES)}",
        )
    return value, []


def _quantization(
    config: dict[str, Any], hf_quant: dict[str, Any] | None
) -> tuple[QuantizationInfo | None, list[str]]:
    # vLLM reads `quantization_config` first and falls back to hf_quant_config.json (ModelOpt).
    qc = config.get("quantization_config")
    if isinstance(qc, dict):
        return from_quantization_config(qc)
    if hf_quant is not None:
        if isinstance(hf_quant.get("quantization"), dict):
            return from_hf_quant_config(hf_quant)
        return from_quantization_config(hf_quant)
    return None, []


def _with_weights(profile: ModelProfile, model_dir: Path) -> ModelProfile:
    files = checkpoint_files(model_dir)
    present = [f for f in files if f.is_file()]
    weight_bits = profile.quantization.weight_bits if profile.quantization else None
    if files and len(present) == len(files):
        scan = scan_weights(present, num_layers=profile.num_layers, weight_bits=weight_bits)
        notes = []
        if scan.params.total == 0:
            notes.append("safetensors files hold no parameter tensors; counts from config.json")
            return replace(profile, weight_bytes_on_disk=scan.bytes_on_disk,
                           weight_bytes_loaded=scan.bytes_loaded,
                           warnings=profile.warnings + tuple(notes))
        if scan.skipped_tensors:
            notes.append(
                f"{scan.skipped_tensors} tensors of layers >= {profile.num_layers} (MTP / "
                "next-token-prediction) are not loaded by vLLM and not counted"
            )
        return replace(
            profile,
            params=scan.params,
            params_source="safetensors",
            weight_bytes_on_disk=scan.bytes_on_disk,
            weight_bytes_loaded=scan.bytes_loaded,
            warnings=profile.warnings + tuple(notes),
        )
    total = index_total_size(model_dir)
    if files and present != files:
        missing = len(files) - len(present)
        note = (f"{missing} of {len(files)} safetensors shards are missing; parameters come "
                "from config.json")
        return replace(profile, weight_bytes_on_disk=total, warnings=(*profile.warnings, note))
    return replace(profile, weight_bytes_on_disk=total)

