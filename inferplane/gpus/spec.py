"""`GpuSpec`: one GPU model's facts as the planner and the simulator need them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Interconnect = Literal["nvlink", "pcie"]

GIB = 1024**3


@dataclass(frozen=True)
class GpuSpec:
    """A GPU model. Memory is what CUDA reports as total (`cudaMemGetInfo`), not marketing GB."""

    name: str  # canonical name, e.g. "H100-SXM-80GB"
    total_memory_bytes: int  # as torch.cuda.mem_get_info()[1] reports it
    memory_bandwidth_gbps: float  # HBM/GDDR bandwidth, GB/s (10^9 bytes per second)
    bf16_tflops: float  # dense BF16/FP16 tensor-core peak (no sparsity)
    fp8_tflops: float | None  # dense FP8 peak; None when the GPU has no FP8 tensor cores
    compute_capability: tuple[int, int]
    interconnect: Interconnect  # how cards of this model are usually linked to each other
    interconnect_bandwidth_gbps: float  # per-GPU bidirectional NVLink or PCIe bandwidth, GB/s
    aliases: tuple[str, ...] = ()

    @property
    def total_memory_gib(self) -> float:
        return self.total_memory_bytes / GIB

    @property
    def supports_fp8(self) -> bool:
        """FP8 tensor cores (Ada sm_89, Hopper sm_90 and newer)."""
        return self.fp8_tflops is not None
