"""This host's CPU cores and RAM, for `gpus: discover` on a CPU fleet (engine device cpu).

    host = discover_cpu_host()     # CpuHost(cores=(0, 1), memory_bytes=..., available_bytes=...)

Cores are the ones this process may run on (`sched_getaffinity`: a container's or a
cgroup's cpuset, not the machine's), so a bound engine never asks for a core it cannot have.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class CpuHost:
    cores: tuple[int, ...]  # usable core ids, ascending
    memory_bytes: int  # total RAM
    available_bytes: int  # RAM free for new processes right now (psutil's `available`)


def usable_cores() -> tuple[int, ...]:
    """The core ids this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))


def discover_cpu_host() -> CpuHost:
    import psutil

    memory = psutil.virtual_memory()
    return CpuHost(usable_cores(), int(memory.total), int(memory.available))
