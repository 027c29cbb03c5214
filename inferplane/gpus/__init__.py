"""GPU models (the catalog) and this host's GPUs (NVML discovery)."""

from inferplane.gpus.catalog import find_gpu, known_gpus, lookup_gpu
from inferplane.gpus.spec import GIB, GpuSpec

__all__ = ["GIB", "GpuSpec", "find_gpu", "known_gpus", "lookup_gpu"]
