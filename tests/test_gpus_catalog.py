"""The GPU catalog: forgiving lookup and the invariants the planner relies on."""

from __future__ import annotations

import pytest

from inferplane.errors import InferplaneError
from inferplane.gpus import GIB, find_gpu, known_gpus, lookup_gpu
from inferplane.gpus.catalog import normalize_gpu_name

# Every name form users and NVML produce, with the entry it must resolve to.
ALIASES = [
    ("NVIDIA H100 80GB HBM3", "H100-SXM-80GB"),
    ("NVIDIA H100 PCIe", "H100-PCIE-80GB"),
    ("NVIDIA H100 NVL", "H100-NVL-94GB"),
    ("NVIDIA A100-SXM4-80GB", "A100-SXM-80GB"),
    ("NVIDIA A100-SXM4-40GB", "A100-SXM-40GB"),
    ("NVIDIA A100 80GB PCIe", "A100-PCIE-80GB"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA L40", "L40"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA A10", "A10"),
    ("NVIDIA A10G", "A10G"),
    ("Tesla T4", "T4"),
    ("NVIDIA GeForce RTX 4090", "RTX-4090"),
    ("NVIDIA GeForce RTX 3090", "RTX-3090"),
    ("NVIDIA RTX A6000", "RTX-A6000"),
    ("NVIDIA H200", "H200"),
    ("NVIDIA H20", "H20"),
    ("NVIDIA B200", "B200"),
    ("Tesla V100-SXM2-16GB", "V100-SXM-16GB"),
    ("Tesla V100-SXM2-32GB", "V100-SXM-32GB"),
    ("h100", "H100-SXM-80GB"),
    ("H100", "H100-SXM-80GB"),
    ("a100", "A100-SXM-80GB"),
    ("H100-SXM-80GB", "H100-SXM-80GB"),
    ("h100_sxm_80gb", "H100-SXM-80GB"),
    ("a100-40gb", "A100-SXM-40GB"),
    ("A100 40GB", "A100-SXM-40GB"),
    ("4090", "RTX-4090"),
    ("rtx 4090", "RTX-4090"),
    ("3090", "RTX-3090"),
    ("l40s", "L40S"),
    ("  L40S  ", "L40S"),
    ("a6000", "RTX-A6000"),
]


@pytest.mark.parametrize(("name", "expected"), ALIASES)
def test_lookup_accepts_every_alias_form(name: str, expected: str) -> None:
    assert lookup_gpu(name).name == expected


def test_lookup_of_canonical_names_is_identity() -> None:
    for spec in known_gpus():
        assert lookup_gpu(spec.name) is spec
        assert lookup_gpu(spec.name.lower()) is spec


def test_required_models_are_present() -> None:
    required = {
        "T4", "A10", "A10G", "L4", "L40S", "L40", "A100-SXM-40GB", "A100-SXM-80GB",
        "A100-PCIE-80GB", "H100-SXM-80GB", "H100-PCIE-80GB", "H100-NVL-94GB", "H200",
        "H20", "B200", "RTX-3090", "RTX-4090", "RTX-A6000", "V100-SXM-16GB", "V100-SXM-32GB",
    }
    assert required <= {s.name for s in known_gpus()}


def test_memory_is_cuda_total_not_marketing_gb() -> None:
    # Field figures: an L40S reports 44.39 GiB, an A100-40GB 39.39 GiB, an RTX 4090 23.64.
    assert lookup_gpu("L40S").total_memory_gib == pytest.approx(44.39, abs=0.005)
    assert lookup_gpu("a100-40gb").total_memory_gib == pytest.approx(39.39, abs=0.005)
    assert lookup_gpu("a100").total_memory_gib == pytest.approx(79.15, abs=0.005)
    assert lookup_gpu("4090").total_memory_gib == pytest.approx(23.64, abs=0.005)
    assert lookup_gpu("H200").total_memory_gib == pytest.approx(139.81, abs=0.005)
    for spec in known_gpus():
        marketing_gb = {"T4": 16, "A10": 24, "A10G": 24, "L4": 24, "L40S": 48, "L40": 48,
                        "H200": 141, "H20": 96, "B200": 180, "RTX-3090": 24, "RTX-4090": 24,
                        "RTX-A6000": 48, "V100-SXM-16GB": 16, "V100-SXM-32GB": 32}.get(spec.name)
        if marketing_gb is None:
            marketing_gb = int(spec.name.rsplit("-", 1)[1].removesuffix("GB"))
        # Below the box figure even read as GiB (HBM stacks are GiB-sized), yet within 10%.
        assert 0.9 * marketing_gb * 10**9 < spec.total_memory_bytes < marketing_gb * GIB


def test_catalog_invariants() -> None:
    specs = known_gpus()
    assert len({s.name for s in specs}) == len(specs)
    for spec in specs:
        assert spec.total_memory_bytes > 8 * GIB
        assert spec.memory_bandwidth_gbps > 0 and spec.bf16_tflops > 0
        assert spec.interconnect in ("nvlink", "pcie")
        assert spec.interconnect_bandwidth_gbps > 0
        # FP8 tensor cores exist from Ada (8.9) and Hopper (9.0) on, and run at 2x BF16.
        assert spec.supports_fp8 == (spec.compute_capability >= (8, 9))
        if spec.fp8_tflops is not None:
            assert spec.fp8_tflops == pytest.approx(2 * spec.bf16_tflops, rel=0.02)
        if "SXM" in spec.name or "NVL" in spec.name:
            assert spec.interconnect == "nvlink"
        if "PCIE" in spec.name:
            assert spec.interconnect == "pcie"
        for alias in spec.aliases:
            assert lookup_gpu(alias) is spec


def test_unknown_name_lists_known_models_and_fix() -> None:
    with pytest.raises(InferplaneError) as info:
        lookup_gpu("Radeon 7900")
    err = info.value
    assert err.field == "gpu" and err.value == "Radeon 7900"
    assert "L40S" in err.message and "H100-SXM-80GB" in err.message
    assert err.fix is not None and "--gpu-memory-gib" in err.fix


def test_ambiguous_name_is_refused_with_choices() -> None:
    with pytest.raises(InferplaneError) as info:
        lookup_gpu("Tesla V100")
    assert "V100-SXM-16GB" in info.value.render() and "V100-SXM-32GB" in info.value.render()


def test_lookalike_names_do_not_match_each_other() -> None:
    assert lookup_gpu("a10").name == "A10"
    assert lookup_gpu("l4").name == "L4"
    assert find_gpu("NVIDIA H200 NVL") is None
    assert find_gpu("NVIDIA A100-PCIE-40GB") is None
    assert find_gpu("nvidia") is None


def test_normalize_strips_vendor_words_and_separators() -> None:
    assert normalize_gpu_name("NVIDIA GeForce RTX 4090") == "rtx4090"
    assert normalize_gpu_name("Tesla V100-SXM2-16GB") == "v100sxm216gb"
    assert normalize_gpu_name("h100_sxm-80GB") == "h100sxm80gb"
