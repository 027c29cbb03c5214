"""Exact counts from safetensors headers of tiny model directories built by the factory."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest
from model_factory import (
    DTYPE_BYTES,
    llama_tensors,
    make_model_dir,
    tiny_llama_config,
    write_safetensors,
)

from inferplane.errors import InferplaneError
from inferplane.models import load_profile
from inferplane.models.safetensors_reader import read_header


def _bytes(tensors: dict[str, tuple[str, list[int]]]) -> int:
    return sum(math.prod(shape) * DTYPE_BYTES[dtype] for dtype, shape in tensors.values())


def test_factory_file_is_a_valid_safetensors_file(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    write_safetensors(path, {"a": ("BF16", [3, 5]), "b": ("F32", [7])})
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    assert header["a"] == {"dtype": "BF16", "shape": [3, 5], "data_offsets": [0, 30]}
    assert header["b"]["data_offsets"] == [30, 58]
    assert len(raw) == 8 + length + 58 and length % 8 == 0


def test_headers_give_exact_counts_matching_the_architecture(tmp_path: Path) -> None:
    config = tiny_llama_config()
    tensors = llama_tensors(config)
    from_config = load_profile(make_model_dir(tmp_path, config, name="cfg-only"))
    p = load_profile(make_model_dir(tmp_path, config, tensors))
    assert p.params_source == "safetensors"
    assert p.params == from_config.params  # header roles agree with the architecture rules
    assert p.params.total == sum(math.prod(s) for _, s in tensors.values())
    assert p.weight_bytes_on_disk == p.weight_bytes_loaded == _bytes(tensors)
    assert p.params.embedding == p.params.lm_head == 256 * 64


def test_tied_checkpoint_has_no_lm_head(tmp_path: Path) -> None:
    config = tiny_llama_config(tie_word_embeddings=True)
    p = load_profile(make_model_dir(tmp_path, config, llama_tensors(config)))
    assert p.params.lm_head == 0 and p.params.embedding == 256 * 64


def test_sharded_checkpoint_is_read_through_its_index(tmp_path: Path) -> None:
    config = tiny_llama_config(num_hidden_layers=4)
    tensors = llama_tensors(config)
    model_dir = make_model_dir(tmp_path, config, tensors, shards=3)
    assert len(list(model_dir.glob("model-*-of-00003.safetensors"))) == 3
    # A stray file the index does not name is not loaded by vLLM and must not be counted.
    write_safetensors(model_dir / "consolidated.safetensors", {"x": ("BF16", [1000, 1000])})
    p = load_profile(model_dir)
    assert p.params.total == sum(math.prod(s) for _, s in tensors.values())
    assert p.weight_bytes_on_disk == _bytes(tensors)


def test_missing_shard_falls_back_to_config_and_index_total(tmp_path: Path) -> None:
    config = tiny_llama_config()
    tensors = llama_tensors(config)
    model_dir = make_model_dir(tmp_path, config, tensors, shards=2)
    (model_dir / "model-00002-of-00002.safetensors").unlink()
    p = load_profile(model_dir)
    assert p.params_source == "config"
    assert p.weight_bytes_on_disk == _bytes(tensors)  # index metadata.total_size
    assert any("1 of 2 safetensors shards are missing" in w for w in p.warnings)


def test_mtp_layer_beyond_num_hidden_layers_is_not_counted(tmp_path: Path) -> None:
    config = tiny_llama_config()
    tensors = llama_tensors(config)
    extra = {"model.layers.2.eh_proj.weight": ("BF16", [64, 128]),
             "model.layers.2.enorm.weight": ("BF16", [64])}
    p = load_profile(make_model_dir(tmp_path, config, {**tensors, **extra}))
    assert p.params.total == sum(math.prod(s) for _, s in tensors.values())
    assert p.weight_bytes_on_disk == _bytes(tensors) + _bytes(extra)
    assert p.weight_bytes_loaded == _bytes(tensors)
    assert any("not loaded by vLLM" in w for w in p.warnings)


def test_awq_packed_weights_are_unpacked_and_scales_skipped(tmp_path: Path) -> None:
    config = tiny_llama_config(
        num_hidden_layers=1, torch_dtype="float16",
        quantization_config={"quant_method": "awq", "bits": 4, "group_size": 32,
                             "version": "gemm", "zero_point": True},
    )
    p_ = "model.layers.0.self_attn.q_proj."
    tensors = {
        "model.embed_tokens.weight": ("F16", [256, 64]),
        p_ + "qweight": ("I32", [64, 64 // 8]),
        p_ + "qzeros": ("I32", [64 // 32, 64 // 8]),
        p_ + "scales": ("F16", [64 // 32, 64]),
        "model.layers.0.input_layernorm.weight": ("F16", [64]),
        "lm_head.weight": ("F16", [256, 64]),
    }
    p = load_profile(make_model_dir(tmp_path, config, tensors))
    assert p.params.linear == 64 * 64  # 8 int4 values per int32
    assert p.params.other == 64
    assert p.weight_bytes_on_disk == _bytes(tensors)  # scales and zeros still occupy bytes


def test_moe_and_mxfp4_expert_tensors_are_classified(tmp_path: Path) -> None:
    config = tiny_llama_config(num_hidden_layers=1)
    e = "model.layers.0.mlp.experts."
    tensors = {
        "model.embed_tokens.weight": ("BF16", [256, 64]),
        e + "gate_up_proj_blocks": ("U8", [4, 256, 2, 16]),  # 4 experts, 2 blocks of 32 values
        e + "gate_up_proj_scales": ("U8", [4, 256, 2]),
        e + "gate_up_proj_bias": ("BF16", [4, 256]),
        "model.layers.0.mlp.router.weight": ("BF16", [4, 64]),
        "model.layers.0.mlp.shared_experts.down_proj.weight": ("BF16", [64, 32]),
        "model.layers.0.self_attn.sinks": ("BF16", [4]),
    }
    p = load_profile(make_model_dir(tmp_path, config, tensors))
    assert p.params.experts == 4 * 256 * 64
    assert p.params.other == 4 * 256 + 4 * 64 + 4
    assert p.params.linear == 64 * 32  # shared experts are dense


def test_vision_tower_tensors_count_as_other(tmp_path: Path) -> None:
    config = tiny_llama_config(num_hidden_layers=1)
    tensors = {
        "language_model.model.embed_tokens.weight": ("BF16", [256, 64]),
        "vision_tower.vision_model.encoder.layers.5.self_attn.q_proj.weight": ("BF16", [8, 8]),
        "multi_modal_projector.mm_input_projection_weight": ("BF16", [8, 64]),
    }
    p = load_profile(make_model_dir(tmp_path, config, tensors))
    # Layer 5 of the vision tower is not an MTP layer of the 1-layer decoder.
    assert p.params.other == 64 + 8 * 64 and p.params.embedding == 256 * 64


@pytest.mark.parametrize(
    "content",
    [b"", b"\x05\x00\x00", struct.pack("<Q", 50) + b"{}", struct.pack("<Q", 4) + b"nope",
     struct.pack("<Q", 2**40) + b"{}", struct.pack("<Q", 2) + b"[]"],
    ids=["empty", "short-length", "truncated", "not-json", "huge-length", "not-object"],
)
def test_broken_safetensors_file_gives_inferplane_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    with pytest.raises(InferplaneError) as err:
        read_header(path)
    assert err.value.location == str(path) and err.value.fix


def test_broken_header_entry_names_the_tensor(tmp_path: Path) -> None:
    raw = json.dumps({"w": {"dtype": "BF16", "shape": [2]}}).encode()
    path = tmp_path / "m.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)
    with pytest.raises(InferplaneError, match="'w'"):
        read_header(path)
