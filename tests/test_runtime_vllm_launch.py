"""vLLM launch building blocks: argv, explicit GPU pinning, free-memory refusal, nofile."""

from __future__ import annotations

import resource

import pytest

from inferplane.errors import InferplaneError
from inferplane.gpus.discovery import discover_gpus
from inferplane.gpus.fake_nvml import FakeDevice, FakeNvml, FakeProcess
from inferplane.gpus.spec import GIB
from inferplane.runtime.vllm_launch import build_vllm_command, preflight_gpus, raise_nofile_limit
from inferplane.spec import EngineSpec, ModelSpec

UUIDS = [
    "GPU-aaaaaaaa-0000-0000-0000-000000000000",
    "GPU-bbbbbbbb-0000-0000-0000-000000000001",
    "GPU-cccccccc-0000-0000-0000-000000000002",
]


def _gpus(used_gib: tuple[float, ...] = (0, 0, 0)) -> FakeNvml:
    return FakeNvml(
        [
            FakeDevice(
                "NVIDIA L40S", uuid=uuid,
                processes=[FakeProcess(4242, int(used * GIB), "python3")] if used else [],
            )
            for uuid, used in zip(UUIDS, used_gib, strict=True)
        ]
    )


def _model(**fields: object) -> ModelSpec:
    data = {"name": "llama", "source": "meta-llama/Llama-3.1-8B", **fields}
    return ModelSpec.model_validate(data)


def test_uuids_become_nvml_indices_and_visible_devices_are_explicit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # inherited from the shell (P21)
    gpus = discover_gpus(_gpus())
    launch = build_vllm_command(
        _model(served_model_name="llama-8b"), gpu_ids=[UUIDS[2], "1"], gpus=gpus, port=8123,
        max_model_len=16384, tensor_parallel_size=2, gpu_memory_utilization=0.85,
    )
    assert launch.gpu_indices == (2, 1)
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "2,1"
    assert launch.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    argv = list(launch.argv)
    assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B"]
    assert argv[argv.index("--served-model-name") + 1] == "llama-8b"
    assert argv[argv.index("--max-model-len") + 1] == "16384"
    assert argv[argv.index("--port") + 1] == "8123"
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.85"


def test_uuid_prefix_model_options_extra_args_and_env() -> None:
    gpus = discover_gpus(_gpus())
    model = _model(
        task="embed", dtype="bfloat16", quantization="fp8", max_num_seqs=64,
        extra_args={"enable-chunked-prefill": True}, env={"VLLM_LOGGING_LEVEL": "DEBUG"},
    )
    launch = build_vllm_command(
        model, gpu_ids=["GPU-bbbb"], gpus=gpus, port=1, max_model_len=512,
        tensor_parallel_size=1, gpu_memory_utilization=0.5,
        engine=EngineSpec(kind="vllm", extra_env={"HF_HUB_OFFLINE": "1"}),
    )
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "1"
    assert launch.env["HF_HUB_OFFLINE"] == "1" and launch.env["VLLM_LOGGING_LEVEL"] == "DEBUG"
    tail = " ".join(launch.argv)
    for part in ("--dtype bfloat16", "--quantization fp8", "--max-num-seqs 64",
                 "--runner pooling", "--enable-chunked-prefill"):
        assert part in tail


def test_wrong_gpu_count_and_unknown_gpu_are_refused() -> None:
    gpus = discover_gpus(_gpus())
    with pytest.raises(InferplaneError, match="tensor_parallel_size 2"):
        build_vllm_command(_model(), gpu_ids=["0"], gpus=gpus, port=1, max_model_len=1,
                           tensor_parallel_size=2, gpu_memory_utilization=0.9)
    with pytest.raises(InferplaneError, match="no such GPU"):
        build_vllm_command(_model(), gpu_ids=["GPU-ffff"], gpus=gpus, port=1, max_model_len=1,
                           tensor_parallel_size=1, gpu_memory_utilization=0.9)


def test_preflight_refuses_an_occupied_card_naming_the_holder() -> None:
    gpus = discover_gpus(_gpus(used_gib=(0, 20, 0)))
    preflight_gpus((0, 2), gpus, 0.9)  # free cards pass
    preflight_gpus((1,), gpus, 0.4)  # 0.4 of 45 GiB fits next to 20 GiB used
    with pytest.raises(InferplaneError, match=r"GPU 1 .*pid 4242 \(python3"):
        preflight_gpus((0, 1), gpus, 0.9)


def test_nofile_is_raised_up_to_the_hard_limit() -> None:
    soft0, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
        soft, _ = raise_nofile_limit(4096)
        want = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
        assert soft == want == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft0, hard))
