"""Checkpoint quantization from `quantization_config` (config.json) or `hf_quant_config.json`.

Method names are vLLM's (`--quantization` values). `group_size` is the number of weight
elements sharing one scale: 128 for AWQ/GPTQ g128, 32 for MXFP4, 128x128 = 16384 for
block-FP8; None for per-tensor or per-channel scales.
"""

from __future__ import annotations

import math
from typing import Any

from inferplane.models.profile import QuantizationInfo

HF_QUANT_CONFIG_FILE = "hf_quant_config.json"
_MODELOPT_ALGOS: dict[str, tuple[str, int, int | None]] = {
    # quant_algo -> (vLLM method, weight bits, default group size)
    "FP8": ("modelopt", 8, None),
    "NVFP4": ("modelopt_fp4", 4, 16),
}


def _excluded(qc: dict[str, Any]) -> tuple[str, ...]:
    names: list[str] = []
    for key in ("modules_to_not_convert", "ignore", "exclude_modules", "ignored_layers"):
        value = qc.get(key)
        if isinstance(value, list):
            names.extend(str(v).strip() for v in value)
    return tuple(dict.fromkeys(names))  # de-duplicated, order kept


def _positive_int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _kv_dtype_from_algo(algo: Any) -> str | None:
    return str(algo).lower() if isinstance(algo, str) and algo.upper() == "FP8" else None


def from_quantization_config(qc: dict[str, Any]) -> tuple[QuantizationInfo | None, list[str]]:
    """Parse a `quantization_config` block; unknown methods give (None, [warning])."""
    method = str(qc.get("quant_method", "")).lower()
    excluded = _excluded(qc)
    if method in ("fp8", "fbgemm_fp8", "ptpc_fp8"):
        block = qc.get("weight_block_size")
        group = math.prod(block) if isinstance(block, list) and block else None
        return QuantizationInfo(method, 8, group, excluded_modules=excluded), []
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin", "autoround"):
        bits = _positive_int(qc.get("bits")) or _positive_int(qc.get("w_bit"))
        if bits is None:
            return None, [f"quantization_config ({method}) has no `bits`; assumed unquantized"]
        # group_size -1 means one scale per output channel (not a fixed group).
        group = _positive_int(qc.get("group_size")) or _positive_int(qc.get("q_group_size"))
        return QuantizationInfo(method, bits, group, excluded_modules=excluded), []
    if method == "mxfp4":
        return QuantizationInfo("mxfp4", 4, 32, excluded_modules=excluded), []
    if method == "compressed-tensors":
        return _compressed_tensors(qc, excluded)
    if method == "modelopt":
        return _modelopt(qc.get("quantization", qc), excluded)
    if method == "bitsandbytes":
        bits = 4 if qc.get("load_in_4bit") else 8
        return QuantizationInfo("bitsandbytes", bits, 64 if bits == 4 else None,
                                excluded_modules=excluded), []
    return None, [
        f"quantization method {method or '(none)'!r} is not modelled; "
        "weights are sized as the checkpoint dtype"
    ]


def _compressed_tensors(
    qc: dict[str, Any], excluded: tuple[str, ...]
) -> tuple[QuantizationInfo | None, list[str]]:
    groups = qc.get("config_groups") or {}
    weights = None
    for group in groups.values() if isinstance(groups, dict) else []:
        if isinstance(group, dict) and isinstance(group.get("weights"), dict):
            weights = group["weights"]
            break
    kv = qc.get("kv_cache_scheme")
    kv_dtype = None
    if isinstance(kv, dict) and kv.get("num_bits") == 8 and kv.get("type") == "float":
        kv_dtype = "fp8"
    if weights is None:
        return None, ["compressed-tensors config without weight scheme; assumed unquantized"]
    bits = _positive_int(weights.get("num_bits")) or 8
    strategy = weights.get("strategy")
    elements_per_scale: int | None = None
    if strategy == "group":
        elements_per_scale = _positive_int(weights.get("group_size"))
    elif strategy == "block" and isinstance(weights.get("block_structure"), list):
        elements_per_scale = math.prod(weights["block_structure"])
    info = QuantizationInfo("compressed-tensors", bits, elements_per_scale, kv_dtype, excluded)
    return info, []


def _modelopt(
    q: dict[str, Any], excluded: tuple[str, ...]
) -> tuple[QuantizationInfo | None, list[str]]:
    algo = str(q.get("quant_algo", "")).upper()
    known = _MODELOPT_ALGOS.get(algo)
    if known is None:
        return None, [f"ModelOpt quant_algo {algo!r} is not modelled; assumed unquantized"]
    method, bits, default_group = known
    group = _positive_int(q.get("group_size")) or default_group
    excluded = excluded or _excluded(q)
    kv = _kv_dtype_from_algo(q.get("kv_cache_quant_algo"))
    return QuantizationInfo(method, bits, group, kv, excluded), []


def from_hf_quant_config(hqc: dict[str, Any]) -> tuple[QuantizationInfo | None, list[str]]:
    """Parse ModelOpt's `hf_quant_config.json` ({"producer": ..., "quantization": {...}})."""
    q = hqc.get("quantization")
    if not isinstance(q, dict):
        return None, [f"{HF_QUANT_CONFIG_FILE} has no `quantization` object; ignored"]
    return _modelopt(q, _excluded(q))
