"""The GPU catalog: one `GpuSpec` per model, and forgiving name lookup.

Memory is the total CUDA reports (`torch.cuda.mem_get_info()[1]`), which is what vLLM
multiplies by `--gpu-memory-utilization`; it is smaller than both the marketing GB and
nvidia-smi's MiB total. Sources for every figure are in docs/gpus.md.
"""

from __future__ import annotations

import re

from inferplane.errors import InferplaneError
from inferplane.gpus.spec import GIB, GpuSpec

# Per-GPU bidirectional bandwidth of a x16 PCIe slot, GB/s.
_PCIE3 = 32.0
_PCIE4 = 64.0
_PCIE5 = 128.0


def _gib(value: float) -> int:
    return round(value * GIB)


_CATALOG: tuple[GpuSpec, ...] = (
    GpuSpec("T4", _gib(14.58), 320.0, 65.0, None, (7, 5), "pcie", _PCIE3,
            aliases=("t4", "tesla t4")),
    GpuSpec("A10", _gib(22.18), 600.0, 125.0, None, (8, 6), "pcie", _PCIE4,
            aliases=("a10", "a10-24gb")),
    GpuSpec("A10G", _gib(22.06), 600.0, 70.0, None, (8, 6), "pcie", _PCIE4,
            aliases=("a10g",)),
    GpuSpec("L4", _gib(22.03), 300.0, 121.0, 242.0, (8, 9), "pcie", _PCIE4,
            aliases=("l4",)),
    GpuSpec("L40S", _gib(44.39), 864.0, 362.0, 733.0, (8, 9), "pcie", _PCIE4,
            aliases=("l40s", "l40-s")),
    GpuSpec("L40", _gib(44.40), 864.0, 181.0, 362.0, (8, 9), "pcie", _PCIE4,
            aliases=("l40",)),
    GpuSpec("A100-SXM-40GB", _gib(39.39), 1555.0, 312.0, None, (8, 0), "nvlink", 600.0,
            aliases=("a100-40gb", "a100-sxm4-40gb", "a100-sxm-40gb", "a100 40gb")),
    GpuSpec("A100-SXM-80GB", _gib(79.15), 2039.0, 312.0, None, (8, 0), "nvlink", 600.0,
            aliases=("a100", "a100-80gb", "a100-sxm4-80gb", "a100-sxm-80gb", "a100 sxm")),
    GpuSpec("A100-PCIE-80GB", _gib(79.15), 1935.0, 312.0, None, (8, 0), "pcie", _PCIE4,
            aliases=("a100-pcie-80gb", "a100 80gb pcie", "a100-80gb-pcie", "a100 pcie")),
    GpuSpec("H100-SXM-80GB", _gib(79.11), 3350.0, 989.0, 1979.0, (9, 0), "nvlink", 900.0,
            aliases=("h100", "h100-sxm", "h100-sxm5", "h100-sxm5-80gb",
                     "h100 80gb hbm3", "h100-sxm-80gb")),
    GpuSpec("H100-PCIE-80GB", _gib(79.11), 2000.0, 756.0, 1513.0, (9, 0), "pcie", _PCIE5,
            aliases=("h100 pcie", "h100-pcie", "h100-pcie-80gb", "h100 80gb pcie")),
    GpuSpec("H100-NVL-94GB", _gib(93.09), 3900.0, 835.0, 1671.0, (9, 0), "nvlink", 600.0,
            aliases=("h100 nvl", "h100-nvl", "h100-nvl-94gb", "h100-94gb")),
    # China-market parts: the A100/H100 die and memory, NVLink cut to 400 GB/s (NVIDIA's
    # A800/H800 datasheets); memory as the A100/H100 80 GB they are built from (docs/gpus.md)
    GpuSpec("A800-SXM-80GB", _gib(79.15), 2039.0, 312.0, None, (8, 0), "nvlink", 400.0,
            aliases=("a800", "a800-sxm4-80gb", "a800-sxm-80gb", "a800 sxm")),
    GpuSpec("H800-SXM-80GB", _gib(79.11), 3350.0, 989.0, 1979.0, (9, 0), "nvlink", 400.0,
            aliases=("h800", "h800-sxm", "h800-sxm5", "h800-sxm-80gb", "h800 80gb hbm3")),
    GpuSpec("H200", _gib(139.81), 4800.0, 989.0, 1979.0, (9, 0), "nvlink", 900.0,
            aliases=("h200", "h200-sxm", "h200-141gb", "h200-sxm-141gb")),
    GpuSpec("H20", _gib(95.00), 4000.0, 148.0, 296.0, (9, 0), "nvlink", 900.0,
            aliases=("h20", "h20-96gb")),
    GpuSpec("B200", _gib(178.35), 8000.0, 2250.0, 4500.0, (10, 0), "nvlink", 1800.0,
            aliases=("b200", "b200-180gb", "b200-sxm")),
    GpuSpec("RTX-3090", _gib(23.70), 936.0, 71.0, None, (8, 6), "pcie", _PCIE4,
            aliases=("3090", "rtx3090", "rtx 3090", "geforce rtx 3090")),
    GpuSpec("RTX-4090", _gib(23.64), 1008.0, 165.2, 330.3, (8, 9), "pcie", _PCIE4,
            aliases=("4090", "rtx4090", "rtx 4090", "geforce rtx 4090")),
    GpuSpec("RTX-A6000", _gib(47.53), 768.0, 154.8, None, (8, 6), "pcie", _PCIE4,
            aliases=("a6000", "rtx a6000", "rtxa6000")),
    GpuSpec("V100-SXM-16GB", _gib(15.77), 900.0, 125.0, None, (7, 0), "nvlink", 300.0,
            aliases=("v100-16gb", "v100-sxm2-16gb", "v100-sxm-16gb", "v100 16gb")),
    GpuSpec("V100-SXM-32GB", _gib(31.74), 900.0, 125.0, None, (7, 0), "nvlink", 300.0,
            aliases=("v100-32gb", "v100-sxm2-32gb", "v100-sxm-32gb", "v100 32gb")),
)

# Names that fit several catalog entries equally well: refusing beats a silent guess
# that could be off by half the memory.
_AMBIGUOUS: dict[str, tuple[str, ...]] = {
    "v100": ("V100-SXM-16GB", "V100-SXM-32GB"),
    "v100sxm2": ("V100-SXM-16GB", "V100-SXM-32GB"),
    # H100 80 GB comes as SXM and PCIe: bandwidth 3350 vs 2000 GB/s changes bench/capacity
    "h10080gb": ("H100-SXM-80GB", "H100-PCIE-80GB"),
}

# Vendor words NVML and users put in front of the model; they never tell models apart.
_NOISE_PREFIXES = ("nvidia", "tesla", "geforce", "quadro")


def normalize_gpu_name(name: str) -> str:
    """Lower-case, drop vendor words and every space, dash, underscore and dot."""
    key = re.sub(r"[\s\-_.]+", "", name.lower())
    stripped = True
    while stripped:
        stripped = False
        for prefix in _NOISE_PREFIXES:
            if key.startswith(prefix) and len(key) > len(prefix):
                key = key[len(prefix):]
                stripped = True
    return key


def _build_index() -> dict[str, GpuSpec]:
    index: dict[str, GpuSpec] = {}
    for spec in _CATALOG:
        for alias in (spec.name, *spec.aliases):
            key = normalize_gpu_name(alias)
            other = index.get(key)
            if other is not None and other is not spec:
                raise RuntimeError(f"alias {alias!r} names both {other.name} and {spec.name}")
            index[key] = spec
    return index


_INDEX = _build_index()


def known_gpus() -> list[GpuSpec]:
    """Every catalog entry, in catalog order."""
    return list(_CATALOG)


def find_gpu(name: str) -> GpuSpec | None:
    """The spec for `name`, or None when the name is unknown or ambiguous."""
    return _INDEX.get(normalize_gpu_name(name))


def lookup_gpu(name: str) -> GpuSpec:
    """The spec for `name`, matched forgivingly (NVML names, short names, any case).

    Raises `InferplaneError` for unknown or ambiguous names.
    """
    key = normalize_gpu_name(name)
    spec = _INDEX.get(key)
    if spec is not None:
        return spec
    if key in _AMBIGUOUS:
        choices = " or ".join(_AMBIGUOUS[key])
        raise InferplaneError(
            f"GPU name is ambiguous: it could be {choices}",
            field="gpu",
            value=name,
            fix=f"name the exact model ({choices})",
        )
    near = nearest_gpu_names(name)
    raise InferplaneError(
        "unknown GPU model" + (f"; did you mean {' or '.join(near)}?" if near else
                               f"; known models: {', '.join(s.name for s in _CATALOG)}"),
        field="gpu",
        value=name,
        fix="use a known name (`inferplane gpus` lists them), or give the memory directly "
        "with --gpu-memory-gib",
    )


def nearest_gpu_names(name: str, limit: int = 3) -> list[str]:
    """Catalog names closest to a name that matches none (`H100-80G` -> the two H100 80GB)."""
    import difflib

    keys = {**{k: (s.name,) for k, s in _INDEX.items()}, **_AMBIGUOUS}
    found: list[str] = []
    for key in difflib.get_close_matches(normalize_gpu_name(name), keys, n=limit, cutoff=0.75):
        found += [n for n in keys[key] if n not in found]
    return found[:limit]
