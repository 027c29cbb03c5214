"""The version-aware `vllm serve` argv builder (P32, P05)."""

from __future__ import annotations

import json

import pytest

from inferplane.engines.vllm import VllmArgs, build_vllm_argv, check_argv, flag_problem
from inferplane.errors import InferplaneError


def _args(**fields: object) -> VllmArgs:
    base: dict[str, object] = {
        "source": "/models/qwen3-8b", "served_model_name": "qwen3-8b", "port": 8100,
        "max_model_len": 8192, "tensor_parallel_size": 1, "gpu_memory_utilization": 0.88,
    }
    base.update(fields)
    return VllmArgs(**base)  # type: ignore[arg-type]


def test_first_class_settings_become_flags() -> None:
    argv = build_vllm_argv(
        _args(max_num_seqs=64, max_num_batched_tokens=4096, dtype="bfloat16",
              quantization="fp8", kv_cache_dtype="fp8", kv_cache_memory_bytes=123,
              enable_prefix_caching=True),
        version="0.26.0",
    )
    assert argv[:5] == ["vllm", "serve", "/models/qwen3-8b", "--served-model-name", "qwen3-8b"]
    joined = " ".join(argv)
    for part in ("--port 8100", "--max-model-len 8192", "--tensor-parallel-size 1",
                 "--gpu-memory-utilization 0.88", "--max-num-seqs 64",
                 "--max-num-batched-tokens 4096", "--dtype bfloat16", "--quantization fp8",
                 "--kv-cache-dtype fp8", "--kv-cache-memory-bytes 123",
                 "--enable-prefix-caching"):
        assert part in joined


def test_removed_flag_is_an_error_naming_the_replacement() -> None:
    with pytest.raises(InferplaneError) as caught:
        build_vllm_argv(_args(extra_args={"swap-space": 4}), version="0.26.0")
    err = caught.value
    assert "--swap-space was removed in vLLM 0.11.0" in err.message
    assert err.fix is not None and "kv-offloading" in err.fix
    # The release it still existed in accepts it.
    assert "--swap-space" in build_vllm_argv(_args(extra_args={"swap-space": 4}), version="0.8.5")


def test_renamed_flags_point_at_the_new_spelling() -> None:
    problem = flag_problem("--speculative-model", "0.10.0")
    assert problem is not None and "--speculative-config" in problem[1]
    assert flag_problem("--enable-prefix-caching", "0.26.0") is None
    with pytest.raises(InferplaneError, match="disable-log-requests"):
        check_argv(["vllm", "serve", "m", "--disable-log-requests"], "0.12.0")


def test_flags_newer_than_the_version_are_refused() -> None:
    with pytest.raises(InferplaneError, match=r"needs vLLM 0\.11\.0 or newer"):
        build_vllm_argv(_args(kv_cache_memory_bytes=1 << 30), version="0.10.1")


def test_embedding_runner_flag_follows_the_version() -> None:
    assert "--runner" in build_vllm_argv(_args(task="embed"), version="0.26.0")
    old = build_vllm_argv(_args(task="embed"), version="0.9.2")
    assert old[old.index("--task") + 1] == "embed" and "--runner" not in old


def test_shrunk_capture_sizes_are_one_json_argument_and_keep_user_settings() -> None:
    argv = build_vllm_argv(
        _args(cudagraph_capture_sizes=(1, 2, 4, 8),
              extra_args={"compilation-config": {"level": 3}}),
        version="0.26.0",
    )
    config = json.loads(argv[argv.index("--compilation-config") + 1])
    assert config == {"level": 3, "cudagraph_capture_sizes": [1, 2, 4, 8]}
    eager = build_vllm_argv(_args(cudagraph_capture_sizes=(1, 2), enforce_eager=True))
    assert "--compilation-config" not in eager and "--enforce-eager" in eager


def test_bad_numbers_are_refused() -> None:
    with pytest.raises(InferplaneError, match="fraction of the card"):
        build_vllm_argv(_args(gpu_memory_utilization=1.5))
    with pytest.raises(InferplaneError, match="max_model_len"):
        build_vllm_argv(_args(max_model_len=0))
