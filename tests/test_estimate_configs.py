"""`estimate` on every committed real config: KV bytes/token and weights match hand math.

KV bytes/token = sum over KV layers of 2 x kv_heads x head_dim x 2 bytes (bf16), or for MLA
(kv_lora_rank + qk_rope_head_dim) x 2 bytes with no K/V pair. Weights for an unquantized
bf16 model at TP 1 = parameters x 2 bytes + the rotary cos/sin table.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from inferplane.estimator.memory import estimate_memory
from inferplane.estimator.types import EngineSettings
from inferplane.gpus import lookup_gpu
from inferplane.gpus.spec import GIB
from inferplane.models import load_profile

MODELS = Path(__file__).parent / "data" / "models"

# model folder -> (KV bytes per token, bf16, whole model), computed by hand from config.json
KV_BYTES_PER_TOKEN = {
    "meta-llama--Llama-3.1-8B": 32 * 2 * 8 * 128 * 2,
    "meta-llama--Llama-3.1-8B-Instruct": 32 * 2 * 8 * 128 * 2,
    "meta-llama--Llama-3.1-70B-Instruct": 80 * 2 * 8 * 128 * 2,
    "nvidia--Llama-3.1-70B-Instruct-FP8": 80 * 2 * 8 * 128 * 2,
    "Qwen--Qwen2.5-7B-Instruct": 28 * 2 * 4 * 128 * 2,
    "Qwen--Qwen3-8B": 36 * 2 * 8 * 128 * 2,
    "Qwen--Qwen3-14B": 40 * 2 * 8 * 128 * 2,
    "Qwen--Qwen3-32B": 64 * 2 * 8 * 128 * 2,
    "Qwen--Qwen3-32B-FP8": 64 * 2 * 8 * 128 * 2,
    "Qwen--Qwen3-30B-A3B": 48 * 2 * 4 * 128 * 2,
    "Qwen--Qwen3-235B-A22B": 94 * 2 * 4 * 128 * 2,
    "Qwen--Qwen3-235B-A22B-FP8": 94 * 2 * 4 * 128 * 2,
    "Qwen--Qwen3-Embedding-0.6B": 28 * 2 * 8 * 128 * 2,
    "deepseek-ai--DeepSeek-V3": 61 * (512 + 64) * 2,
    "deepseek-ai--DeepSeek-R1": 61 * (512 + 64) * 2,
    "google--gemma-2-9b-it": 42 * 2 * 8 * 256 * 2,
    "google--gemma-3-27b-it": 62 * 2 * 16 * 128 * 2,
    "mistralai--Mistral-7B-Instruct-v0.3": 32 * 2 * 8 * 128 * 2,
    "mistralai--Mixtral-8x7B-v0.1": 32 * 2 * 8 * 128 * 2,
    "openai--gpt-oss-20b": 24 * 2 * 8 * 64 * 2,
    "openai--gpt-oss-120b": 36 * 2 * 8 * 64 * 2,
    "Qwen--Qwen2.5-14B-Instruct": 48 * 2 * 8 * 128 * 2,
    "Qwen--Qwen2.5-32B-Instruct": 64 * 2 * 8 * 128 * 2,
    "microsoft--phi-4": 40 * 2 * 10 * 128 * 2,
    "zai-org--GLM-4.5-Air": 46 * 2 * 8 * 128 * 2,  # the MTP layer holds no KV in serving
    "zai-org--GLM-4.6": 92 * 2 * 8 * 128 * 2,
    "zai-org--GLM-4.6-FP8": 92 * 2 * 8 * 128 * 2,
    "deepseek-ai--DeepSeek-V3.2": 61 * (512 + 64) * 2,  # MLA latent; the indexer's K not counted
}

# Unquantized models: (parameters, vocab, hidden, max positions, rotary dim) for hand math.
UNQUANTIZED = [
    "meta-llama--Llama-3.1-8B-Instruct",
    "meta-llama--Llama-3.1-70B-Instruct",
    "Qwen--Qwen2.5-7B-Instruct",
    "Qwen--Qwen3-8B",
    "Qwen--Qwen3-32B",
    "Qwen--Qwen3-30B-A3B",
    "mistralai--Mixtral-8x7B-v0.1",
    "mistralai--Mistral-7B-Instruct-v0.3",
    "google--gemma-2-9b-it",
]

H200 = lookup_gpu("H200")


def committed_model_dirs() -> list[str]:
    return sorted(p.name for p in MODELS.iterdir() if (p / "config.json").exists())


def test_every_committed_config_has_a_hand_computed_kv_figure() -> None:
    missing = set(committed_model_dirs()) - set(KV_BYTES_PER_TOKEN)
    assert not missing, f"add hand-computed KV bytes/token for {sorted(missing)}"


@pytest.mark.parametrize("model", sorted(KV_BYTES_PER_TOKEN))
def test_kv_bytes_per_token(model: str) -> None:
    profile = load_profile(MODELS / model)
    est = estimate_memory(profile, EngineSettings(max_model_len=4096), gpu=H200)
    assert est.kv_bytes_per_token == KV_BYTES_PER_TOKEN[model]


@pytest.mark.parametrize("model", UNQUANTIZED)
def test_bf16_weights_are_two_bytes_per_parameter(model: str) -> None:
    profile = load_profile(MODELS / model)
    est = estimate_memory(profile, EngineSettings(max_model_len=4096), gpu=H200)
    rope_table = profile.max_position_embeddings * profile.head_dim * 2
    expected = profile.params.total * 2 + rope_table
    assert est.weights_gib == pytest.approx(expected / GIB, abs=2e-4)


def test_llama_8b_weights_match_published_parameter_count() -> None:
    # 8,030,261,248 parameters (Hugging Face model card) x 2 bytes + 131072 x 128 x 2 rope table
    est = estimate_memory(
        load_profile(MODELS / "meta-llama--Llama-3.1-8B-Instruct"),
        EngineSettings(max_model_len=8192), gpu=H200,
    )
    assert est.weights_gib == pytest.approx((8_030_261_248 * 2 + 131072 * 128 * 2) / GIB, abs=2e-4)


def test_fp8_checkpoint_halves_projection_weights() -> None:
    bf16 = estimate_memory(
        load_profile(MODELS / "Qwen--Qwen3-32B"), EngineSettings(max_model_len=8192), gpu=H200
    )
    fp8 = estimate_memory(
        load_profile(MODELS / "Qwen--Qwen3-32B-FP8"), EngineSettings(max_model_len=8192), gpu=H200
    )
    assert fp8.quantization == "fp8"
    assert 0.5 < fp8.weights_gib / bf16.weights_gib < 0.56  # embeddings + lm_head stay bf16


def run_estimate(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    """`inferplane estimate ARGS` in a real subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "inferplane", "estimate", *args],
        capture_output=True, text=True, check=check,
    )


def test_cli_json_prints_one_object_with_required_keys() -> None:
    out = run_estimate(
        str(MODELS / "Qwen--Qwen3-8B"),
        "--gpu", "L40S", "--max-model-len", "16384", "--json", check=True
    )
    data = json.loads(out.stdout)
    for key in ("weights_gib", "kv_cache_gib", "kv_cache_tokens", "max_concurrency",
                "max_model_len", "kv_bytes_per_token", "activation_gib", "cuda_graph_gib",
                "non_torch_gib", "fits", "warnings", "errors"):
        assert key in data
    assert data["fits"] is True and data["kv_bytes_per_token"] == 147456


def test_cli_json_invalid_request_still_prints_object_and_exits_2() -> None:
    out = run_estimate(
        str(MODELS / "Qwen--Qwen2.5-7B-Instruct"),
        "--gpu", "A100-80GB", "--tensor-parallel-size", "3", "--max-model-len", "8192", "--json"
    )
    assert out.returncode == 2
    data = json.loads(out.stdout)
    assert data["fits"] is False
    assert any("P11" in e for e in data["errors"])


def test_cli_unknown_gpu_is_a_clear_error() -> None:
    out = run_estimate(
        str(MODELS / "Qwen--Qwen3-8B"),
        "--gpu", "Z9000"
    )
    assert out.returncode == 2
    assert "Z9000" in out.stderr and "Traceback" not in out.stderr


def test_cli_max_model_len_auto() -> None:
    out = run_estimate(
        str(MODELS / "Qwen--Qwen3-8B"),
        "--gpu", "L4", "--max-model-len", "auto", "--json", check=True
    )
    data = json.loads(out.stdout)
    # About 3.3 GiB of KV at 147,456 B/token: roughly 24K tokens, less than the 40,960 maximum.
    expected = int(data["kv_cache_gib"] * 1024**3 / 147456)
    assert 0.97 * expected <= data["max_model_len"] <= expected
    assert data["max_concurrency"] == 1.0
