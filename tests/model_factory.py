"""Build tiny, real model directories for tests (config.json + safetensors), without torch.

Other test modules use these helpers: `make_model_dir(tmp_path, tiny_llama_config())` gives a
directory that `inferplane.models.load_profile` reads like a downloaded checkpoint, and
`embed_model_dir(path)` one that the simulator serves as an embedding model.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

from inferplane.sim.build import DEFAULT_PROFILE_CONFIG

# Bytes per element of safetensors dtypes (sub-byte types are not needed by the tests).
DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
    "U16": 2, "U32": 4, "U64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
}

TensorSpec = tuple[str, list[int]]  # (safetensors dtype, shape)


def write_safetensors(path: Path, tensors: dict[str, TensorSpec]) -> None:
    """Write a valid safetensors file: 8-byte header length, JSON header, zeroed data."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = math.prod(shape) * DTYPE_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8-byte alignment
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        f.truncate(8 + len(raw) + offset)  # sparse zero bytes: fast for any size


def make_model_dir(
    root: Path,
    config: dict[str, Any],
    tensors: dict[str, TensorSpec] | None = None,
    shards: int = 1,
    name: str = "tiny-model",
) -> Path:
    """Create `root/name` with config.json and, if given, the tensors in `shards` files.

    With shards > 1 the files are `model-0000i-of-0000N.safetensors` plus
    `model.safetensors.index.json` (weight_map and metadata.total_size), as Hugging Face writes.
    """
    model_dir = root / name
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(config, indent=2))
    if not tensors:
        return model_dir
    if shards <= 1:
        write_safetensors(model_dir / "model.safetensors", tensors)
        return model_dir
    names = list(tensors)
    per_shard = math.ceil(len(names) / shards)
    weight_map: dict[str, str] = {}
    for i in range(shards):
        file_name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[i * per_shard:(i + 1) * per_shard]}
        write_safetensors(model_dir / file_name, part)
        weight_map.update(dict.fromkeys(part, file_name))
    total = sum(math.prod(s) * DTYPE_BYTES[d] for d, s in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (model_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return model_dir


def tiny_llama_config(**overrides: Any) -> dict[str, Any]:
    """A small but complete LlamaForCausalLM config.json (2 layers, GQA 4/2, vocab 256)."""
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 256,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    config.update(overrides)
    return config


def llama_tensors(config: dict[str, Any], dtype: str = "BF16") -> dict[str, TensorSpec]:
    """The tensors a Llama checkpoint with `config` holds (Hugging Face names and shapes)."""
    h = config["hidden_size"]
    inter = config["intermediate_size"]
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads", heads)
    hd = config.get("head_dim") or h // heads
    vocab = config["vocab_size"]
    t: dict[str, TensorSpec] = {"model.embed_tokens.weight": (dtype, [vocab, h])}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = (dtype, [heads * hd, h])
        t[p + "self_attn.k_proj.weight"] = (dtype, [kv * hd, h])
        t[p + "self_attn.v_proj.weight"] = (dtype, [kv * hd, h])
        t[p + "self_attn.o_proj.weight"] = (dtype, [h, heads * hd])
        t[p + "mlp.gate_proj.weight"] = (dtype, [inter, h])
        t[p + "mlp.up_proj.weight"] = (dtype, [inter, h])
        t[p + "mlp.down_proj.weight"] = (dtype, [h, inter])
        t[p + "input_layernorm.weight"] = (dtype, [h])
        t[p + "post_attention_layernorm.weight"] = (dtype, [h])
    t["model.norm.weight"] = (dtype, [h])
    if not config.get("tie_word_embeddings", False):
        t["lm_head.weight"] = (dtype, [vocab, h])
    return t


def embed_model_dir(path: Path, **config: Any) -> Path:
    """A sentence-transformers layout (config.json + modules.json with a Pooling module) at
    `path`: the simulator, like vLLM, serves it as an embedding model. `config` overrides
    keys of the simulator's default profile config."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({**DEFAULT_PROFILE_CONFIG, **config}))
    (path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
    ]))  # fmt: skip
    return path
