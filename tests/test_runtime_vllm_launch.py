"""vLLM pre-start checks: free-memory refusal naming the holder, nofile. (Pinning and argv
from the plan are tested in test_runtime_vllm_fleet.py and test_engines_vllm_argv.py.)"""

from __future__ import annotations

import resource

import pytest

from inferplane.errors import InferplaneError
from inferplane.gpus.discovery import discover_gpus
from inferplane.gpus.fake_nvml import FakeDevice, FakeNvml, FakeProcess
from inferplane.gpus.spec import GIB
from inferplane.runtime.vllm_launch import preflight_gpus, raise_nofile_limit

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
