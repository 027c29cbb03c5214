"""`FakeNvml`: an in-memory `NvmlApi` built from a list of fake devices, for tests.

Use it wherever code takes an `nvml` argument:

    nvml = FakeNvml([FakeDevice("NVIDIA L40S", used_bytes=GIB,
                                processes=[FakeProcess(4242, GIB, "python3")])])
    gpus = discover_gpus(nvml)

Like real NVML, every query outside an init()/shutdown() session fails, so tests also
catch code that forgets to open one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from inferplane.gpus.catalog import find_gpu
from inferplane.gpus.nvml import (
    TOPOLOGY_HOSTBRIDGE,
    TOPOLOGY_INTERNAL,
    TOPOLOGY_MULTIPLE,
    TOPOLOGY_NODE,
    TOPOLOGY_SINGLE,
    TOPOLOGY_SYSTEM,
    MemoryInfo,
    RunningProcess,
)

# nvidia-smi MiB totals for NVML names, so a FakeDevice looks like the real card by default.
_NVIDIA_SMI_MIB: dict[str, int] = {
    "Tesla T4": 15360,
    "NVIDIA A10": 23028,
    "NVIDIA A10G": 23028,
    "NVIDIA L4": 23034,
    "NVIDIA L40S": 46068,
    "NVIDIA A100-SXM4-40GB": 40960,
    "NVIDIA A100-SXM4-80GB": 81920,
    "NVIDIA H100 80GB HBM3": 81559,
    "NVIDIA H200": 143771,
    "NVIDIA GeForce RTX 4090": 24564,
}

_LEVELS: dict[str, int] = {
    "internal": TOPOLOGY_INTERNAL,
    "pix": TOPOLOGY_SINGLE,
    "pxb": TOPOLOGY_MULTIPLE,
    "phb": TOPOLOGY_HOSTBRIDGE,
    "node": TOPOLOGY_NODE,
    "sys": TOPOLOGY_SYSTEM,
}


class FakeNvmlError(RuntimeError):
    """Raised where real pynvml would raise an NVMLError."""


@dataclass(frozen=True)
class FakeProcess:
    pid: int
    used_bytes: int | None
    name: str | None = None  # None: NVML cannot name it (another container)


@dataclass
class FakeDevice:
    """One fake GPU. Total defaults to the real card's nvidia-smi total, or its CUDA total."""

    name: str
    uuid: str | None = None
    total_bytes: int | None = None
    used_bytes: int = 0
    processes: list[FakeProcess] = field(default_factory=list)
    pci_bus_id: str | None = None

    def resolved_total(self) -> int:
        if self.total_bytes is not None:
            return self.total_bytes
        if self.name in _NVIDIA_SMI_MIB:
            return _NVIDIA_SMI_MIB[self.name] * 1024**2
        spec = find_gpu(self.name)
        if spec is None:
            raise ValueError(f"FakeDevice {self.name!r}: give total_bytes for unknown models")
        return spec.total_memory_bytes


class FakeNvml:
    """An `NvmlApi` over `FakeDevice`s. Handles are device indices.

    `links` maps an index pair to "nvlink" or a PCIe level ("pix", "pxb", "phb", "node",
    "sys"); pairs not listed get `default_link`. `init_error` makes init() fail the way
    a host without a driver does.
    """

    def __init__(
        self,
        devices: Iterable[FakeDevice],
        *,
        links: Mapping[tuple[int, int], str] | None = None,
        default_link: str = "phb",
        driver_version: str = "550.54.15",
        cuda_driver_version: int = 12040,
        init_error: str | None = None,
    ) -> None:
        self.devices = list(devices)
        self._nvlink: set[frozenset[int]] = set()
        self._levels: dict[frozenset[int], int] = {}
        for (a, b), link in (links or {}).items():
            self._check_index(a)
            self._check_index(b)
            if link == "nvlink":
                self._nvlink.add(frozenset((a, b)))
            else:
                self._levels[frozenset((a, b))] = _LEVELS[link]
        self._default_level = _LEVELS[default_link]
        self._driver_version = driver_version
        self._cuda_driver_version = cuda_driver_version
        self._init_error = init_error
        self.sessions = 0  # open init() calls, like NVML's reference count
        self.init_calls = 0

    def _check_index(self, index: int) -> None:
        if not 0 <= index < len(self.devices):
            raise ValueError(f"no fake device {index}")

    def _require_session(self) -> None:
        if self.sessions <= 0:
            raise FakeNvmlError("NVML_ERROR_UNINITIALIZED: call init() first")

    def _device(self, handle: Any) -> FakeDevice:
        self._require_session()
        return self.devices[int(handle)]

    def init(self) -> None:
        self.init_calls += 1
        if self._init_error is not None:
            raise FakeNvmlError(self._init_error)
        self.sessions += 1

    def shutdown(self) -> None:
        self._require_session()
        self.sessions -= 1

    def device_count(self) -> int:
        self._require_session()
        return len(self.devices)

    def handle_by_index(self, index: int) -> Any:
        self._require_session()
        if not 0 <= index < len(self.devices):
            raise FakeNvmlError("NVML_ERROR_INVALID_ARGUMENT")
        return index

    def name(self, handle: Any) -> str:
        return self._device(handle).name

    def uuid(self, handle: Any) -> str:
        device = self._device(handle)
        if device.uuid is not None:
            return device.uuid
        return f"GPU-00000000-0000-0000-0000-{int(handle):012x}"

    def memory_info(self, handle: Any) -> MemoryInfo:
        device = self._device(handle)
        total = device.resolved_total()
        used = device.used_bytes + sum(p.used_bytes or 0 for p in device.processes)
        used = min(used, total)
        return MemoryInfo(total=total, free=total - used, used=used)

    def running_processes(self, handle: Any) -> list[RunningProcess]:
        return [RunningProcess(p.pid, p.used_bytes) for p in self._device(handle).processes]

    def process_name(self, pid: int) -> str | None:
        self._require_session()
        for device in self.devices:
            for process in device.processes:
                if process.pid == pid:
                    return process.name
        return None

    def pci_bus_id(self, handle: Any) -> str:
        device = self._device(handle)
        if device.pci_bus_id is not None:
            return device.pci_bus_id
        return f"00000000:{0x18 + 0x10 * int(handle):02X}:00.0"

    def topology_common_ancestor(self, a: Any, b: Any) -> int:
        self._device(a)
        self._device(b)
        if int(a) == int(b):
            return TOPOLOGY_INTERNAL
        return self._levels.get(frozenset((int(a), int(b))), self._default_level)

    def nvlink_connected(self, a: Any, b: Any) -> bool:
        self._device(a)
        self._device(b)
        return frozenset((int(a), int(b))) in self._nvlink

    def driver_version(self) -> str:
        self._require_session()
        return self._driver_version

    def cuda_driver_version(self) -> int:
        self._require_session()
        return self._cuda_driver_version
