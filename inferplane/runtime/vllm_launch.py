"""Pre-start checks for launching `vllm serve` on pinned GPUs (the argv comes from the plan).

    gpus = discover_gpus(nvml)
    preflight_gpus(instance.gpu_indices, gpus, instance.gpu_memory_utilization)  # names holders
    raise_nofile_limit()                                                          # P30
"""

from __future__ import annotations

from inferplane.errors import InferplaneError
from inferplane.gpus.discovery import DiscoveredGpu, check_free_memory
from inferplane.runtime.process import raise_nofile_limit

__all__ = ["preflight_gpus", "raise_nofile_limit"]


def preflight_gpus(
    indices: tuple[int, ...] | list[int], gpus: list[DiscoveredGpu], gpu_memory_utilization: float
) -> None:
    """Refuse to start unless each target GPU has the memory the instance will take
    (utilization × total) free; the error names the processes holding it (P19, P22)."""
    by_index = {gpu.index: gpu for gpu in gpus}
    for index in indices:
        gpu = by_index.get(index)
        if gpu is None:
            raise InferplaneError(
                "no such GPU on this host", field="gpu", value=index,
                fix="use an index from `inferplane gpus --discover`",
            )
        check_free_memory(gpu, int(gpu.total_bytes * gpu_memory_utilization))
