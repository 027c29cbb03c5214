"""Everything `doctor` reads from the host, behind one small interface (`Host`), plus the
parsers for what the NVIDIA tools print.

`LocalHost` reads this machine (subprocess, NVML, /dev/shm, rlimits, sockets, installed
packages); tests give a `Host` that replays recorded outputs. A method returns None when
the thing cannot be read here, and `why_not` says why.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from inferplane.gpus.nvml import NvmlApi

MIB = 2**20


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str = ""


class Host(Protocol):
    def run(self, argv: list[str]) -> CommandResult | None:
        """The command's output, or None when the program is not installed."""

    def nvml(self) -> NvmlApi | None:
        """An NVML API (real or fake), or None when the library cannot be loaded."""

    def env(self) -> Mapping[str, str]: ...
    def nofile_limit(self) -> tuple[int, int] | None: ...
    def shm_bytes(self) -> int | None: ...
    def package_version(self, name: str) -> str | None: ...
    def read_speed_mib_s(self, path: Path, limit_bytes: int) -> float | None: ...
    def port_free(self, host: str, port: int) -> bool: ...

    def dir_unwritable(self, path: Path) -> str | None:
        """Why `up` could not create and write files in `path`, or None when it can."""


class LocalHost:
    """This machine."""

    def run(self, argv: list[str]) -> CommandResult | None:
        if shutil.which(argv[0]) is None:
            return None
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return CommandResult(127, "", str(exc))
        return CommandResult(done.returncode, done.stdout, done.stderr)

    nvml_error: str | None = None

    def nvml(self) -> NvmlApi | None:
        try:
            from inferplane.gpus.discovery import default_nvml

            api = default_nvml()
            api.init()
            api.shutdown()
            return api
        except Exception as exc:  # pynvml raises NVMLError_LibraryNotFound and friends
            self.nvml_error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return None

    def env(self) -> Mapping[str, str]:
        return os.environ

    def nofile_limit(self) -> tuple[int, int] | None:
        try:
            import resource
        except ImportError:  # not on Linux/macOS
            return None
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        return soft, hard

    def shm_bytes(self) -> int | None:
        try:
            st = os.statvfs("/dev/shm")
        except OSError:
            return None
        return st.f_frsize * st.f_blocks

    def package_version(self, name: str) -> str | None:
        from importlib import metadata

        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    def read_speed_mib_s(self, path: Path, limit_bytes: int) -> float | None:
        try:
            with open(path, "rb", buffering=0) as handle:
                start = time.perf_counter()
                done = 0
                while done < limit_bytes:
                    chunk = handle.read(min(16 * MIB, limit_bytes - done))
                    if not chunk:
                        break
                    done += len(chunk)
                elapsed = time.perf_counter() - start
        except OSError:
            return None
        return done / MIB / elapsed if done and elapsed > 0 else None

    def dir_unwritable(self, path: Path) -> str | None:
        target = path
        while not target.exists():  # `up` creates the missing levels
            if target.parent == target:
                return f"no existing parent directory of {path}"
            target = target.parent
        if not target.is_dir():
            return f"{target} is not a directory"
        # access(2) also answers EROFS for a read-only mount; doctor itself writes nothing
        if not os.access(target, os.W_OK | os.X_OK):
            return f"this user cannot create files in {target} (permissions or read-only)"
        return None

    def port_free(self, host: str, port: int) -> bool:
        import socket

        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError:
                return False
        return True


# --- parsers for nvidia-smi output --------------------------------------------------------

_DRIVER = re.compile(r"Driver Version:\s*([0-9.]+)")
_CUDA = re.compile(r"CUDA Version:\s*([0-9]+\.[0-9]+)")


def parse_smi_header(text: str) -> tuple[str | None, str | None]:
    """(driver version, CUDA version the driver supports) from `nvidia-smi`'s banner."""
    driver = _DRIVER.search(text)
    cuda = _CUDA.search(text)
    return (driver.group(1) if driver else None, cuda.group(1) if cuda else None)


@dataclass(frozen=True)
class MigDevice:
    gpu: int
    profile: str  # e.g. "1g.10gb"
    uuid: str


_GPU_LINE = re.compile(r"^GPU (\d+): (.+?) \(UUID: (GPU-[0-9a-fA-F-]+)\)")
_MIG_LINE = re.compile(r"^\s+MIG (\S+)\s+Device\s+\d+: \(UUID: (MIG-[0-9a-fA-F-/]+)\)")


def parse_smi_list(text: str) -> tuple[list[tuple[int, str, str]], list[MigDevice]]:
    """GPUs (index, name, uuid) and MIG devices from `nvidia-smi -L`."""
    gpus: list[tuple[int, str, str]] = []
    migs: list[MigDevice] = []
    for line in text.splitlines():
        m = _GPU_LINE.match(line)
        if m is not None:
            gpus.append((int(m.group(1)), m.group(2), m.group(3)))
            continue
        m = _MIG_LINE.match(line)
        if m is not None and gpus:
            migs.append(MigDevice(gpus[-1][0], m.group(1), m.group(2)))
    return gpus, migs


_COMPUTE_GPU = re.compile(r"^GPU ([0-9A-Fa-f:.]+)\s*$")
_COMPUTE_MODE = re.compile(r"^\s+Compute Mode\s*:\s*(\S+)")


def parse_compute_modes(text: str) -> list[tuple[str, str]]:
    """(PCI bus id, compute mode) per GPU from `nvidia-smi -q -d COMPUTE`."""
    modes: list[tuple[str, str]] = []
    bus: str | None = None
    for line in text.splitlines():
        m = _COMPUTE_GPU.match(line)
        if m is not None:
            bus = m.group(1)
            continue
        m = _COMPUTE_MODE.match(line)
        if m is not None and bus is not None:
            modes.append((bus, m.group(1)))
            bus = None
    return modes


LINK_RANK = {"NV": 0, "PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5}
GOOD_FOR_TP = ("NV", "PIX")


def link_kind(cell: str) -> str | None:
    """`NV12` -> NV; PIX/PXB/PHB/NODE/SYS as they are; X and others -> None."""
    if re.fullmatch(r"NV\d+", cell):
        return "NV"
    return cell if cell in LINK_RANK else None


def parse_topo_matrix(text: str) -> dict[tuple[int, int], str]:
    """GPU pairs (a < b) -> link kind from `nvidia-smi topo -m` (NIC rows/columns ignored)."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    header = next((ln for ln in lines if re.match(r"^\s*(?:\x1b\[[0-9;]*m)?\s*GPU0\b", ln)), None)
    if header is None:
        return {}
    columns = [c for c in re.sub(r"\x1b\[[0-9;]*m", "", header).split()]
    gpu_cols = [i for i, c in enumerate(columns) if re.fullmatch(r"GPU\d+", c)]
    pairs: dict[tuple[int, int], str] = {}
    for line in lines:
        cells = re.sub(r"\x1b\[[0-9;]*m", "", line).split()
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]):
            continue
        row = int(cells[0][3:])
        for i in gpu_cols:
            if i + 1 >= len(cells):
                continue
            col = int(columns[i][3:])
            kind = link_kind(cells[i + 1])
            if kind is not None and row < col:
                pairs[(row, col)] = kind
    return pairs


def best_group(pairs: dict[tuple[int, int], str], gpus: list[int], size: int) -> tuple[
        list[int], str] | None:
    """The `size` GPUs whose worst pairwise link is best (greedy from each start GPU), with
    that worst link; None when there are fewer GPUs than `size`."""
    if size > len(gpus):
        return None
    if size == 1:
        return [gpus[0]], "NV"

    def link(a: int, b: int) -> str:
        return pairs.get((min(a, b), max(a, b)), "SYS")

    best: tuple[list[int], str] | None = None
    for start in gpus:
        group = [start]
        while len(group) < size:
            rest = [g for g in gpus if g not in group]
            nxt = min(rest, key=lambda g: (max(LINK_RANK[link(g, x)] for x in group), g))
            group.append(nxt)
        worst = max((link(a, b) for a in group for b in group if a < b),
                    key=lambda k: LINK_RANK[k])
        if best is None or LINK_RANK[worst] < LINK_RANK[best[1]]:
            best = (sorted(group), worst)
    return best


_TORCH_CUDA = re.compile(r"\+cu(\d+)")


def torch_cuda_version(torch_version: str | None) -> str | None:
    """`2.5.1+cu124` -> `12.4` (the CUDA the wheel was built for)."""
    if not torch_version:
        return None
    m = _TORCH_CUDA.search(torch_version)
    if m is None:
        return None
    digits = m.group(1)
    return f"{digits[:-1]}.{digits[-1]}"
