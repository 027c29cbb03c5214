"""Quantization detection: FP8 (block and ModelOpt), AWQ, GPTQ, MXFP4, compressed-tensors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from model_factory import make_model_dir, tiny_llama_config

from inferplane.models import QuantizationInfo, load_profile, profile_from_config

DATA = Path(__file__).parent / "data" / "models"

# The AWQ block of Qwen/Qwen2.5-7B-Instruct-AWQ and most AutoAWQ checkpoints (see SOURCES.md).
AWQ_BLOCK = {"bits": 4, "group_size": 128, "modules_to_not_convert": None,
             "quant_method": "awq", "version": "gemm", "zero_point": True}
# The GPTQ block of Qwen2.5-*-Instruct-GPTQ-Int4 checkpoints.
GPTQ_BLOCK = {"batch_size": 1, "bits": 4, "block_name_to_quantize": None, "damp_percent": 0.01,
              "desc_act": False, "group_size": 128, "quant_method": "gptq", "sym": True,
              "true_sequential": True, "use_exllama": True}


def _quant(quantization_config: dict[str, Any]) -> QuantizationInfo | None:
    config = tiny_llama_config(quantization_config=quantization_config)
    return profile_from_config(config, name="q").quantization


def test_block_fp8_checkpoint() -> None:
    q = load_profile(DATA / "Qwen--Qwen3-32B-FP8").quantization
    assert q == QuantizationInfo("fp8", 8, 128 * 128)


def test_fp8_excluded_modules_are_kept() -> None:
    q = load_profile(DATA / "Qwen--Qwen3-235B-A22B-FP8").quantization
    assert q is not None and "lm_head" in q.excluded_modules
    # The published file has one entry with a trailing space; it is matched without it.
    assert "model.layers.2.mlp.gate" in q.excluded_modules


def test_modelopt_fp8_comes_from_hf_quant_config_json() -> None:
    model_dir = DATA / "nvidia--Llama-3.1-70B-Instruct-FP8"
    assert "quantization_config" not in json.loads((model_dir / "config.json").read_text())
    q = load_profile(model_dir).quantization
    assert q == QuantizationInfo("modelopt", 8, None, "fp8", ("lm_head",))


def test_profile_from_config_accepts_hf_quant_config() -> None:
    model_dir = DATA / "nvidia--Llama-3.1-70B-Instruct-FP8"
    config = json.loads((model_dir / "config.json").read_text())
    hqc = json.loads((model_dir / "hf_quant_config.json").read_text())
    assert profile_from_config(config, name="m").quantization is None
    q = profile_from_config(config, name="m", quant_config=hqc).quantization
    assert q is not None and q.method == "modelopt" and q.kv_cache_dtype == "fp8"


def test_awq_checkpoint(tmp_path: Path) -> None:
    config = json.loads((DATA / "Qwen--Qwen2.5-7B-Instruct" / "config.json").read_text())
    config.update(quantization_config=AWQ_BLOCK, torch_dtype="float16")
    p = load_profile(make_model_dir(tmp_path, config, name="Qwen2.5-7B-Instruct-AWQ"))
    assert p.quantization == QuantizationInfo("awq", 4, 128)
    assert p.torch_dtype == "float16"
    assert p.params.total == 7_615_616_512  # logical parameters are unchanged by packing


def test_gptq_checkpoint() -> None:
    assert _quant(GPTQ_BLOCK) == QuantizationInfo("gptq", 4, 128)
    assert _quant({**GPTQ_BLOCK, "bits": 8, "group_size": -1}) == QuantizationInfo("gptq", 8)


def test_compressed_tensors_w4a16_with_fp8_kv_cache() -> None:
    qc = {
        "quant_method": "compressed-tensors",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
            "num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}},
        "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor"},
        "ignore": ["lm_head"],
    }
    assert _quant(qc) == QuantizationInfo("compressed-tensors", 4, 128, "fp8", ("lm_head",))


def test_compressed_tensors_fp8_per_channel() -> None:
    qc = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": {
        "num_bits": 8, "type": "float", "strategy": "channel"}}}}
    assert _quant(qc) == QuantizationInfo("compressed-tensors", 8, None)


def test_modelopt_nvfp4_in_quantization_config() -> None:
    qc = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
          "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"]}
    assert _quant(qc) == QuantizationInfo("modelopt_fp4", 4, 16, None, ("lm_head",))


def test_unknown_method_is_a_warning_not_a_guess() -> None:
    p = profile_from_config(tiny_llama_config(quantization_config={"quant_method": "hqq"}),
                            name="q")
    assert p.quantization is None
    assert any("'hqq' is not modelled" in w for w in p.warnings)


@pytest.mark.parametrize("block", [{"quant_method": "awq"}, {"quant_method": "gptq", "bits": 0}])
def test_awq_or_gptq_without_bits_is_reported(block: dict[str, Any]) -> None:
    p = profile_from_config(tiny_llama_config(quantization_config=block), name="q")
    assert p.quantization is None and any("no `bits`" in w for w in p.warnings)
