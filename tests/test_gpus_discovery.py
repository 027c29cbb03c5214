"""NVML discovery, UUID resolution, topology and the free-memory refusal, on FakeNvml."""

from __future__ import annotations

import pytest

from inferplane.errors import InferplaneError
from inferplane.gpus import GIB, lookup_gpu
from inferplane.gpus.discovery import (
    check_free_memory,
    discover_gpus,
    driver_versions,
    link_between,
    resolve_visible_devices,
    topology_matrix,
)
from inferplane.gpus.fake_nvml import FakeDevice, FakeNvml, FakeProcess

UUID0 = "GPU-3f1a2b4c-0000-1111-2222-333344445555"
UUID1 = "GPU-9d8e7f6a-aaaa-bbbb-cccc-ddddeeeeffff"
UUID2 = "GPU-9d00ffff-1234-5678-9abc-def012345678"


def _host() -> FakeNvml:
    # S0-like: three L40S; card 0 is busy with another pod's vLLM (P19).
    return FakeNvml(
        [
            FakeDevice("NVIDIA L40S", uuid=UUID0, used_bytes=512 * 1024**2,
                       processes=[FakeProcess(4242, 43 * GIB, "vllm"),
                                  FakeProcess(777, None, None)]),
            FakeDevice("NVIDIA L40S", uuid=UUID1),
            FakeDevice("NVIDIA L40S", uuid=UUID2),
        ],
        links={(0, 1): "pix", (1, 2): "sys"},
        default_link="node",
    )


def test_discover_reads_every_device_and_matches_the_catalog() -> None:
    nvml = _host()
    gpus = discover_gpus(nvml)
    assert [g.index for g in gpus] == [0, 1, 2]
    assert [g.uuid for g in gpus] == [UUID0, UUID1, UUID2]
    first = gpus[0]
    assert first.name == "NVIDIA L40S"
    assert first.total_bytes == 46068 * 1024**2  # nvidia-smi's total, not CUDA's
    assert first.free_bytes == first.total_bytes - 43 * GIB - 512 * 1024**2
    assert first.spec is lookup_gpu("L40S")
    assert first.pci_bus_id.startswith("00000000:")
    assert {(p.pid, p.used_bytes, p.process_name) for p in first.processes} == {
        (4242, 43 * GIB, "vllm"), (777, None, None)}
    assert gpus[1].processes == [] and gpus[1].free_bytes == gpus[1].total_bytes
    assert nvml.sessions == 0 and nvml.init_calls == 1  # session closed again


def test_unknown_model_is_discovered_without_a_spec() -> None:
    nvml = FakeNvml([FakeDevice("NVIDIA Future X1", total_bytes=64 * GIB)])
    (gpu,) = discover_gpus(nvml)
    assert gpu.spec is None and gpu.total_bytes == 64 * GIB


def test_no_driver_is_a_clear_user_error() -> None:
    nvml = FakeNvml([], init_error="NVML Shared Library Not Found")
    with pytest.raises(InferplaneError) as info:
        discover_gpus(nvml)
    assert "NVML Shared Library Not Found" in info.value.message
    assert info.value.fix is not None and "nvidia-smi" in info.value.fix


def test_driver_versions_format_cuda_as_major_minor() -> None:
    nvml = FakeNvml([], driver_version="570.124.06", cuda_driver_version=12080)
    assert driver_versions(nvml) == ("570.124.06", "12.8")


def test_resolve_uuids_and_indices_to_indices() -> None:
    gpus = discover_gpus(_host())
    assert resolve_visible_devices([UUID2, UUID0], gpus) == [2, 0]
    assert resolve_visible_devices(["1", " 0 "], gpus) == [1, 0]
    assert resolve_visible_devices([UUID1.lower()], gpus) == [1]
    assert resolve_visible_devices(["GPU-3f1a"], gpus) == [0]  # unique prefix, as CUDA allows
    assert resolve_visible_devices([], gpus) == []


@pytest.mark.parametrize(
    ("ids", "needle"),
    [
        (["GPU-deadbeef-0000-0000-0000-000000000000"], "GPU-deadbeef"),
        (["3"], "'3'"),
        (["cuda:0"], "cuda:0"),
        (["GPU-9d"], "several GPUs"),
        (["0", UUID0], "listed twice"),
        (["MIG-1b2c3d4e-0000-1111-2222-333344445555"], "MIG"),
    ],
)
def test_resolve_refuses_bad_ids_naming_them(ids: list[str], needle: str) -> None:
    gpus = discover_gpus(_host())
    with pytest.raises(InferplaneError) as info:
        resolve_visible_devices(ids, gpus)
    assert needle in info.value.render()


def test_unknown_id_error_lists_present_gpus() -> None:
    gpus = discover_gpus(_host())
    with pytest.raises(InferplaneError) as info:
        resolve_visible_devices(["GPU-ffff"], gpus)
    assert UUID0 in info.value.message and UUID2 in info.value.message


def test_links_and_topology_matrix() -> None:
    nvml = FakeNvml(
        [FakeDevice("NVIDIA H100 80GB HBM3") for _ in range(4)],
        links={(0, 1): "nvlink", (2, 3): "pxb", (0, 2): "phb"},
        default_link="sys",
    )
    assert link_between(0, 1, nvml) == "nvlink"
    assert link_between(1, 0, nvml) == "nvlink"
    assert link_between(2, 3, nvml) == "pxb"
    assert link_between(0, 2, nvml) == "phb"
    assert link_between(1, 3, nvml) == "sys"
    assert topology_matrix(nvml) == [
        ["X", "nvlink", "phb", "sys"],
        ["nvlink", "X", "sys", "sys"],
        ["phb", "sys", "X", "pxb"],
        ["sys", "sys", "pxb", "X"],
    ]
    assert nvml.sessions == 0
    with pytest.raises(ValueError):
        link_between(1, 1, nvml)


def test_free_memory_refusal_names_the_holders() -> None:
    gpu = discover_gpus(_host())[0]
    needed = int(0.92 * lookup_gpu("L40S").total_memory_bytes)
    with pytest.raises(InferplaneError) as info:
        check_free_memory(gpu, needed)
    text = info.value.render()
    assert "GPU 0" in text and UUID0 in text
    assert "pid 4242 (vllm, 43.00 GiB)" in text
    assert "pid 777 (name not visible, unknown amount)" in text
    assert text.index("pid 4242") < text.index("pid 777")  # biggest holder first
    assert "40.84 GiB" in text  # what was needed, as vLLM would print it
    assert "P22" in text


def test_free_memory_check_passes_when_it_fits() -> None:
    idle = discover_gpus(_host())[1]
    check_free_memory(idle, int(0.92 * lookup_gpu("L40S").total_memory_bytes))
    check_free_memory(idle, idle.free_bytes)  # exactly enough is enough


def test_memory_held_by_an_invisible_process_blames_another_container() -> None:
    nvml = FakeNvml([FakeDevice("NVIDIA L40S", used_bytes=44 * GIB)])
    (gpu,) = discover_gpus(nvml)
    with pytest.raises(InferplaneError) as info:
        check_free_memory(gpu, 10 * GIB)
    assert "another container" in info.value.message and "P19" in info.value.message


def test_fake_nvml_refuses_queries_outside_a_session() -> None:
    nvml = FakeNvml([FakeDevice("NVIDIA L4")])
    with pytest.raises(RuntimeError):
        nvml.device_count()
