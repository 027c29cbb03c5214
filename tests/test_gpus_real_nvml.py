"""The real NVML adapter against the machine's GPUs (run with -m gpu)."""

from __future__ import annotations

import pytest

from inferplane.gpus.discovery import (
    RealNvml,
    discover_gpus,
    driver_versions,
    resolve_visible_devices,
    topology_matrix,
)


@pytest.mark.gpu
def test_real_nvml_discovery_round_trip() -> None:
    nvml = RealNvml()
    gpus = discover_gpus(nvml)
    assert gpus, "a gpu-marked run needs at least one GPU"
    for gpu in gpus:
        assert gpu.uuid.startswith(("GPU-", "MIG-"))
        assert 0 <= gpu.free_bytes <= gpu.total_bytes
        if gpu.spec is not None:
            # NVML's total (nvidia-smi) is at or above CUDA's, by well under 2 GiB.
            gap = gpu.total_bytes - gpu.spec.total_memory_bytes
            assert 0 <= gap < 2 * 1024**3, (gpu.name, gap)
    assert resolve_visible_devices([g.uuid for g in gpus], gpus) == [g.index for g in gpus]
    driver, cuda = driver_versions(nvml)
    assert driver and "." in cuda
    matrix = topology_matrix(nvml)
    assert [row[i] for i, row in enumerate(matrix)] == ["X"] * len(gpus)
