"""Read safetensors headers (never tensor data) and count parameters by role.

A safetensors file starts with an 8-byte little-endian header length N, then N bytes of JSON:
{"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}}.
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferplane.errors import InferplaneError
from inferplane.models.profile import ParamCounts

INDEX_FILE = "model.safetensors.index.json"
_MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors format's own limit
_FIX = "re-download the checkpoint; the file is truncated or not a safetensors file"
# Quantization side tensors: scales, zero points, permutations. Not model parameters.
_AUX_SUFFIXES = (
    ".scales", ".qzeros", ".g_idx", ".weight_scale", ".weight_scale_inv", ".input_scale",
    ".weight_zero_point", ".weight_global_scale", ".input_global_scale", ".k_scale",
    ".v_scale", ".weight_shape", "_scales",
)
_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")
# Vision towers and projectors of multimodal checkpoints: counted as `other`, never skipped.
_VISION_MARKERS = ("vision_tower", "vision_model", "multi_modal_projector", "visual.")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def read_header(path: Path) -> list[TensorInfo]:
    """Tensor entries of one safetensors file, from its JSON header only."""
    try:
        with path.open("rb") as f:
            raw_len = f.read(8)
            if len(raw_len) != 8:
                raise InferplaneError("file is shorter than a safetensors header",
                                      location=str(path), fix=_FIX)
            (length,) = struct.unpack("<Q", raw_len)
            if length > _MAX_HEADER_BYTES:
                raise InferplaneError("safetensors header length is implausible",
                                      value=length, location=str(path), fix=_FIX)
            raw = f.read(length)
    except OSError as exc:
        raise InferplaneError(f"cannot read safetensors file: {exc}",
                              location=str(path), fix=_FIX) from exc
    if len(raw) != length:
        raise InferplaneError("safetensors header is truncated", location=str(path), fix=_FIX)
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InferplaneError(f"safetensors header is not JSON: {exc}",
                              location=str(path), fix=_FIX) from exc
    if not isinstance(header, dict):
        raise InferplaneError("safetensors header is not a JSON object",
                              location=str(path), fix=_FIX)
    return [_entry(name, spec, path) for name, spec in header.items() if name != "__metadata__"]


def _entry(name: str, spec: Any, path: Path) -> TensorInfo:
    try:
        begin, end = spec["data_offsets"]
        shape = tuple(int(d) for d in spec["shape"])
        return TensorInfo(name, str(spec["dtype"]), shape, int(end) - int(begin))
    except (KeyError, TypeError, ValueError) as exc:
        raise InferplaneError(f"malformed safetensors header entry {name!r}",
                              location=str(path), fix=_FIX) from exc


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The safetensors files vLLM would load: the index's shards, else every top-level file."""
    index = model_dir / INDEX_FILE
    if index.is_file():
        weight_map = _index_json(index).get("weight_map")
        if isinstance(weight_map, dict) and weight_map:
            return [model_dir / name for name in sorted(set(map(str, weight_map.values())))]
    return sorted(model_dir.glob("*.safetensors"))


def index_total_size(model_dir: Path) -> int | None:
    """`metadata.total_size` of the shard index (tensor bytes of all shards), if present."""
    index = model_dir / INDEX_FILE
    if not index.is_file():
        return None
    size = (_index_json(index).get("metadata") or {}).get("total_size")
    return int(size) if isinstance(size, int | float) and not isinstance(size, bool) else None


def _index_json(index: Path) -> dict[str, Any]:
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InferplaneError(f"shard index cannot be read: {exc}", location=str(index),
                              fix=_FIX) from exc
    if not isinstance(data, dict):
        raise InferplaneError("shard index is not a JSON object", location=str(index), fix=_FIX)
    return data


@dataclass(frozen=True)
class WeightScan:
    params: ParamCounts
    bytes_on_disk: int  # every tensor in the files
    bytes_loaded: int  # without layers vLLM skips (MTP layers past num_hidden_layers)
    skipped_tensors: int


def scan_weights(files: list[Path], *, num_layers: int, weight_bits: int | None) -> WeightScan:
    """Count logical parameters per role and bytes over all files' headers."""
    roles = dict.fromkeys(("embedding", "lm_head", "linear", "experts", "other"), 0)
    on_disk = loaded = skipped = 0
    for path in files:
        for t in read_header(path):
            on_disk += t.nbytes
            vision = any(m in t.name for m in _VISION_MARKERS)
            layer = None if vision else _LAYER_RE.search(t.name)
            if layer and int(layer.group(1)) >= num_layers:
                skipped += 1  # e.g. DeepSeek-V3's MTP layer 61: vLLM does not load it
                continue
            loaded += t.nbytes
            role = "other" if vision else classify(t.name)
            if role is not None:
                roles[role] += logical_numel(t, weight_bits)
    return WeightScan(ParamCounts(**roles), on_disk, loaded, skipped)


def classify(name: str) -> str | None:
    """Role of a tensor by name; None for quantization side tensors (scales, zeros)."""
    if name.endswith(_AUX_SUFFIXES):
        return None
    if "embed_tokens" in name or name.endswith(("wte.weight", "word_embeddings.weight")):
        return "embedding"
    if name.startswith("lm_head") or ".lm_head." in name:
        return "lm_head"
    if "norm" in name or name.endswith(("bias", "_bias", ".sinks")):
        return "other"
    if ".experts." in name:
        return "experts"
    if name.endswith((".gate.weight", ".router.weight", "shared_expert_gate.weight")):
        return "other"  # MoE router: small, kept in model dtype by most quantizers
    if name.endswith(("weight", ".qweight", ".weight_packed", "_blocks")):
        return "linear"
    return "other"


def logical_numel(t: TensorInfo, weight_bits: int | None) -> int:
    """Unpacked element count: int32-packed AWQ/GPTQ/compressed and MXFP4 u8 blocks."""
    if t.name.endswith((".qweight", ".weight_packed")) and t.dtype in ("I32", "U32"):
        return t.numel * (32 // (weight_bits or 4))
    if t.name.endswith("_blocks") and t.dtype == "U8":
        return t.numel * 2  # two FP4 values per byte
    return t.numel
