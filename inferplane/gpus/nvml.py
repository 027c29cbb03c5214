"""The NVML calls inferplane uses, as a Protocol, and the real adapter over `pynvml`.

Everything above this layer (discovery, pinning, the CLI) talks to `NvmlApi`, so tests
and other modules can run against `FakeNvml` on machines without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

# NVML's GPU topology levels (nvmlGpuTopologyLevel_t), nearest first.
TOPOLOGY_INTERNAL = 0
TOPOLOGY_SINGLE = 10  # one PCIe switch: nvidia-smi "PIX"
TOPOLOGY_MULTIPLE = 20  # several PCIe switches, no host bridge: "PXB"
TOPOLOGY_HOSTBRIDGE = 30  # same PCIe host bridge: "PHB"
TOPOLOGY_NODE = 40  # same NUMA node, across host bridges: "NODE"
TOPOLOGY_SYSTEM = 50  # across NUMA nodes (SMP interconnect): "SYS"


@dataclass(frozen=True)
class MemoryInfo:
    """Device memory as NVML reports it (nvidia-smi's figures), bytes."""

    total: int
    free: int
    used: int


@dataclass(frozen=True)
class RunningProcess:
    """A process with a context on a GPU. `used_bytes` is None when NVML cannot tell."""

    pid: int
    used_bytes: int | None


class NvmlApi(Protocol):
    """The subset of NVML inferplane needs. Handles are opaque to callers."""

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def device_count(self) -> int: ...
    def handle_by_index(self, index: int) -> Any: ...
    def name(self, handle: Any) -> str: ...
    def uuid(self, handle: Any) -> str: ...
    def memory_info(self, handle: Any) -> MemoryInfo: ...
    def running_processes(self, handle: Any) -> list[RunningProcess]: ...
    def process_name(self, pid: int) -> str | None: ...
    def pci_bus_id(self, handle: Any) -> str: ...
    def topology_common_ancestor(self, a: Any, b: Any) -> int: ...
    def nvlink_connected(self, a: Any, b: Any) -> bool: ...
    def driver_version(self) -> str: ...
    def cuda_driver_version(self) -> int: ...


def _text(value: Any) -> str:
    # pynvml returned bytes before 11.5 and str after; accept both.
    return value.decode() if isinstance(value, bytes) else str(value)


class RealNvml:
    """`NvmlApi` over the `pynvml` module (package nvidia-ml-py)."""

    def __init__(self) -> None:
        import pynvml  # imported here so importing inferplane never needs the library

        self._nv = pynvml

    def init(self) -> None:
        self._nv.nvmlInit()

    def shutdown(self) -> None:
        self._nv.nvmlShutdown()

    def device_count(self) -> int:
        return int(self._nv.nvmlDeviceGetCount())

    def handle_by_index(self, index: int) -> Any:
        return self._nv.nvmlDeviceGetHandleByIndex(index)

    def name(self, handle: Any) -> str:
        return _text(self._nv.nvmlDeviceGetName(handle))

    def uuid(self, handle: Any) -> str:
        return _text(self._nv.nvmlDeviceGetUUID(handle))

    def memory_info(self, handle: Any) -> MemoryInfo:
        mem = self._nv.nvmlDeviceGetMemoryInfo(handle)
        return MemoryInfo(total=int(mem.total), free=int(mem.free), used=int(mem.used))

    def running_processes(self, handle: Any) -> list[RunningProcess]:
        # Graphics contexts (Xorg on workstation cards) hold memory too.
        seen: dict[int, RunningProcess] = {}
        for getter in (
            self._nv.nvmlDeviceGetComputeRunningProcesses,
            self._nv.nvmlDeviceGetGraphicsRunningProcesses,
        ):
            try:
                infos = getter(handle)
            except self._nv.NVMLError:
                continue
            for info in infos:
                used = info.usedGpuMemory
                # NVML_VALUE_NOT_AVAILABLE arrives as None (or as 2**64-1 from old bindings).
                used_bytes = None if used is None or used >= 2**63 else int(used)
                seen.setdefault(int(info.pid), RunningProcess(int(info.pid), used_bytes))
        return list(seen.values())

    def process_name(self, pid: int) -> str | None:
        try:
            return Path(_text(self._nv.nvmlSystemGetProcessName(pid))).name or None
        except self._nv.NVMLError:
            pass
        try:
            return Path(f"/proc/{pid}/comm").read_text().strip() or None
        except OSError:
            return None  # another PID namespace (a container) owns it

    def pci_bus_id(self, handle: Any) -> str:
        return _text(self._nv.nvmlDeviceGetPciInfo(handle).busId)

    def topology_common_ancestor(self, a: Any, b: Any) -> int:
        return int(self._nv.nvmlDeviceGetTopologyCommonAncestor(a, b))

    def nvlink_connected(self, a: Any, b: Any) -> bool:
        try:
            status = self._nv.nvmlDeviceGetP2PStatus(a, b, self._nv.NVML_P2P_CAPS_INDEX_NVLINK)
        except self._nv.NVMLError:
            return False
        return bool(status == self._nv.NVML_P2P_STATUS_OK)

    def driver_version(self) -> str:
        return _text(self._nv.nvmlSystemGetDriverVersion())

    def cuda_driver_version(self) -> int:
        return int(self._nv.nvmlSystemGetCudaDriverVersion())
