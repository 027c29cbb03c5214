"""Discover this host's GPUs through NVML, map UUIDs to indices, read topology, check memory.

Every function takes an optional `nvml` (any `NvmlApi`); None means the real driver via
`default_nvml()`. Each call opens and closes its own NVML session (NVML counts them).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from inferplane.errors import InferplaneError
from inferplane.gpus.catalog import find_gpu
from inferplane.gpus.nvml import (
    TOPOLOGY_HOSTBRIDGE,
    TOPOLOGY_INTERNAL,
    TOPOLOGY_MULTIPLE,
    TOPOLOGY_NODE,
    TOPOLOGY_SINGLE,
    TOPOLOGY_SYSTEM,
    MemoryInfo,
    NvmlApi,
    RealNvml,
    RunningProcess,
)
from inferplane.gpus.spec import GIB, GpuSpec

__all__ = [
    "DiscoveredGpu",
    "GpuProcess",
    "MemoryInfo",
    "NvmlApi",
    "RealNvml",
    "RunningProcess",
    "check_free_memory",
    "default_nvml",
    "discover_gpus",
    "driver_versions",
    "host_memory_bytes",
    "link_between",
    "resolve_visible_devices",
    "topology_matrix",
]

_LEVEL_NAMES: dict[int, str] = {
    TOPOLOGY_INTERNAL: "internal",
    TOPOLOGY_SINGLE: "pix",
    TOPOLOGY_MULTIPLE: "pxb",
    TOPOLOGY_HOSTBRIDGE: "phb",
    TOPOLOGY_NODE: "node",
    TOPOLOGY_SYSTEM: "sys",
}


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a GPU. `process_name` is None when it is not visible
    from here (typically another container's PID namespace)."""

    pid: int
    used_bytes: int | None
    process_name: str | None


@dataclass(frozen=True)
class DiscoveredGpu:
    """One GPU as NVML sees it now. Memory figures are NVML's (nvidia-smi's); `spec`
    carries the catalog's CUDA-reported total when the model is known."""

    index: int
    uuid: str
    name: str
    total_bytes: int
    free_bytes: int
    pci_bus_id: str
    processes: list[GpuProcess] = field(default_factory=list)
    spec: GpuSpec | None = None
    # RAM of the host this GPU is in (psutil, at discovery): the planner checks that
    # replicas asleep at sleep level 1, which keep their weights there, fit.
    host_memory_bytes: int | None = None

    @property
    def used_bytes(self) -> int:
        return self.total_bytes - self.free_bytes


def default_nvml() -> NvmlApi:
    """The real NVML; tests replace this function to inject a `FakeNvml`."""
    try:
        return RealNvml()
    except ImportError as exc:
        raise _no_nvml(exc) from exc


def _no_nvml(exc: BaseException) -> InferplaneError:
    return InferplaneError(
        f"cannot talk to the NVIDIA driver through NVML ({exc})",
        field="gpus",
        value="discover",
        fix=(
            "run on a host with an NVIDIA GPU and driver (nvidia-smi must work), or list "
            "the GPUs yourself instead of discovering them"
        ),
    )


@contextmanager
def _session(nvml: NvmlApi | None) -> Iterator[NvmlApi]:
    api = nvml if nvml is not None else default_nvml()
    try:
        api.init()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        raise _no_nvml(exc) from exc
    try:
        yield api
    finally:
        api.shutdown()


def discover_gpus(nvml: NvmlApi | None = None) -> list[DiscoveredGpu]:
    """Every GPU NVML sees, in NVML index order. Raises `InferplaneError` without NVML."""
    host_memory = host_memory_bytes()
    with _session(nvml) as api:
        gpus: list[DiscoveredGpu] = []
        for index in range(api.device_count()):
            handle = api.handle_by_index(index)
            name = api.name(handle)
            memory = api.memory_info(handle)
            processes = [
                GpuProcess(p.pid, p.used_bytes, api.process_name(p.pid))
                for p in api.running_processes(handle)
            ]
            gpus.append(
                DiscoveredGpu(
                    index=index,
                    uuid=api.uuid(handle),
                    name=name,
                    total_bytes=memory.total,
                    free_bytes=memory.free,
                    pci_bus_id=api.pci_bus_id(handle),
                    processes=processes,
                    spec=find_gpu(name),
                    host_memory_bytes=host_memory,
                )
            )
        return gpus


def host_memory_bytes() -> int | None:
    """This host's total RAM in bytes (None when psutil cannot read it)."""
    import psutil

    try:
        return int(psutil.virtual_memory().total)
    except (OSError, RuntimeError):
        return None


def driver_versions(nvml: NvmlApi | None = None) -> tuple[str, str]:
    """(driver version, CUDA driver version as "major.minor"), e.g. ("550.54.15", "12.4")."""
    with _session(nvml) as api:
        cuda = api.cuda_driver_version()
        return api.driver_version(), f"{cuda // 1000}.{cuda % 1000 // 10}"


def resolve_visible_devices(ids: list[str], gpus: list[DiscoveredGpu]) -> list[int]:
    """Map GPU UUIDs ("GPU-…", or a unique prefix) or indices to NVML indices (P20).

    vLLM needs integer indices in CUDA_VISIBLE_DEVICES; MIG instances are refused.
    """
    by_index = {gpu.index: gpu for gpu in gpus}
    resolved: list[int] = []
    for raw in ids:
        ident = raw.strip()
        if ident.isdigit():
            index = int(ident)
            if index not in by_index:
                raise _unknown_device(raw, gpus)
        elif ident.upper().startswith("MIG-"):
            raise InferplaneError(
                "MIG instances cannot be pinned: vLLM takes whole GPUs by integer index "
                "in CUDA_VISIBLE_DEVICES (P20)",
                field="gpus",
                value=raw,
                fix="give the parent GPU's UUID or index, or disable MIG on that GPU",
            )
        elif ident.upper().startswith("GPU-"):
            index = _index_for_uuid(raw, ident, gpus)
        else:
            raise _unknown_device(raw, gpus)
        if index in resolved:
            raise InferplaneError(
                f"GPU {index} is listed twice", field="gpus", value=raw,
                fix="list each GPU once",
            )
        resolved.append(index)
    return resolved


def _index_for_uuid(raw: str, ident: str, gpus: list[DiscoveredGpu]) -> int:
    wanted = ident.lower()
    exact = [g for g in gpus if g.uuid.lower() == wanted]
    if exact:
        return exact[0].index
    # CUDA accepts any unique UUID prefix, so accept the same.
    prefixed = [g for g in gpus if g.uuid.lower().startswith(wanted)]
    if len(prefixed) == 1:
        return prefixed[0].index
    if len(prefixed) > 1:
        raise InferplaneError(
            "GPU UUID prefix matches several GPUs: "
            + ", ".join(f"{g.index}={g.uuid}" for g in prefixed),
            field="gpus", value=raw, fix="give more of the UUID",
        )
    raise _unknown_device(raw, gpus)


def _unknown_device(raw: str, gpus: list[DiscoveredGpu]) -> InferplaneError:
    present = ", ".join(f"{g.index}={g.uuid}" for g in gpus) or "none"
    return InferplaneError(
        f"no such GPU on this host; present: {present}",
        field="gpus",
        value=raw,
        fix="use an index or UUID from `inferplane gpus --discover`",
    )


def link_between(a: int, b: int, nvml: NvmlApi | None = None) -> str:
    """How GPUs a and b talk: "nvlink", or the PCIe level "pix", "pxb", "phb", "node",
    "sys" (nearest first), as in `nvidia-smi topo -m` (P13)."""
    if a == b:
        raise ValueError("link_between needs two different GPUs")
    with _session(nvml) as api:
        return _link(api, api.handle_by_index(a), api.handle_by_index(b))


def _link(api: NvmlApi, ha: object, hb: object) -> str:
    if api.nvlink_connected(ha, hb):
        return "nvlink"
    level = api.topology_common_ancestor(ha, hb)
    return _LEVEL_NAMES.get(level, "sys")


def topology_matrix(nvml: NvmlApi | None = None) -> list[list[str]]:
    """The link between every pair of GPUs; the diagonal is "X" as in nvidia-smi."""
    with _session(nvml) as api:
        handles = [api.handle_by_index(i) for i in range(api.device_count())]
        return [
            ["X" if i == j else _link(api, ha, hb) for j, hb in enumerate(handles)]
            for i, ha in enumerate(handles)
        ]


def check_free_memory(gpu: DiscoveredGpu, needed_bytes: int) -> None:
    """Refuse, naming who holds the memory, when `gpu` has less than `needed_bytes` free
    (P19, P22). Compare against what the instance will allocate (utilization × total)."""
    if gpu.free_bytes >= needed_bytes:
        return
    holders = sorted(gpu.processes, key=lambda p: -(p.used_bytes or 0))
    if holders:
        held_by = "held by " + ", ".join(_describe(p) for p in holders)
    else:
        held_by = (
            "no process visible from here holds it, so another container or VM is "
            "using this GPU (P19)"
        )
    raise InferplaneError(
        f"GPU {gpu.index} ({gpu.name}, {gpu.uuid}) has {_gib(gpu.free_bytes)} free of "
        f"{_gib(gpu.total_bytes)} but this instance needs {_gib(needed_bytes)}; "
        f"{_gib(gpu.used_bytes)} is {held_by}",
        field="gpu",
        value=gpu.index,
        fix=(
            "stop the processes holding it, place the instance on another GPU, or lower "
            "gpu_memory_utilization (P22)"
        ),
    )


def _describe(process: GpuProcess) -> str:
    name = process.process_name or "name not visible"
    used = "unknown amount" if process.used_bytes is None else _gib(process.used_bytes)
    return f"pid {process.pid} ({name}, {used})"


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"
