"""`inferplane gpus [--discover] [--json]`: the GPU catalog, or this host's GPUs via NVML."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from inferplane.cli.main import app
from inferplane.cli.tables import Col, fitted_table
from inferplane.gpus.catalog import known_gpus
from inferplane.gpus.discovery import (
    DiscoveredGpu,
    discover_gpus,
    driver_versions,
    topology_matrix,
)
from inferplane.gpus.spec import GIB, GpuSpec


def _spec_row(spec: GpuSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "memory_gib": round(spec.total_memory_gib, 2),
        "total_memory_bytes": spec.total_memory_bytes,
        "memory_bandwidth_gbps": spec.memory_bandwidth_gbps,
        "bf16_tflops": spec.bf16_tflops,
        "fp8_tflops": spec.fp8_tflops,
        "compute_capability": f"{spec.compute_capability[0]}.{spec.compute_capability[1]}",
        "interconnect": spec.interconnect,
        "interconnect_bandwidth_gbps": spec.interconnect_bandwidth_gbps,
        "aliases": list(spec.aliases),
    }


def _gpu_row(gpu: DiscoveredGpu) -> dict[str, Any]:
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "name": gpu.name,
        "pci_bus_id": gpu.pci_bus_id,
        "total_bytes": gpu.total_bytes,
        "free_bytes": gpu.free_bytes,
        "catalog_name": gpu.spec.name if gpu.spec else None,
        "cuda_total_bytes": gpu.spec.total_memory_bytes if gpu.spec else None,
        "processes": [
            {"pid": p.pid, "used_bytes": p.used_bytes, "process_name": p.process_name}
            for p in gpu.processes
        ],
    }


def _catalog_table() -> Table:
    table = Table(title="GPU catalog: memory GiB as CUDA reports it, dense TFLOPS")
    table.add_column("name", no_wrap=True)
    for column in ("GiB", "mem GB/s", "BF16", "FP8", "CC"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("link GB/s", no_wrap=True)
    for spec in known_gpus():
        table.add_row(
            spec.name,
            f"{spec.total_memory_gib:.2f}",
            f"{spec.memory_bandwidth_gbps:g}",
            f"{spec.bf16_tflops:g}",
            "-" if spec.fp8_tflops is None else f"{spec.fp8_tflops:g}",
            f"{spec.compute_capability[0]}.{spec.compute_capability[1]}",
            f"{spec.interconnect} {spec.interconnect_bandwidth_gbps:g}",
        )
    return table


# The UUID is what pins an engine (CUDA_VISIBLE_DEVICES): never hidden; the name wraps.
HOST_COLUMNS = (
    Col("index", "#"), Col("name", wrap=True), Col("uuid"),
    Col("used / total GiB", "used/total GiB"), Col("catalog", drop=2),
    Col("processes", "procs", drop=1, wrap=True),
)  # fmt: skip


def _host_table(gpus: list[DiscoveredGpu], driver: str, cuda: str, width: int = 200) -> Table:
    rows = []
    for gpu in gpus:
        procs = ", ".join(
            f"{p.pid} {p.process_name or '?'}"
            + ("" if p.used_bytes is None else f" {p.used_bytes / GIB:.1f}G")
            for p in gpu.processes
        )
        rows.append([
            str(gpu.index), gpu.name, gpu.uuid,
            f"{gpu.used_bytes / GIB:.2f} / {gpu.total_bytes / GIB:.2f}",
            gpu.spec.name if gpu.spec else "not in catalog", procs or "-",
        ])  # fmt: skip
    return fitted_table(HOST_COLUMNS, rows, width,
                        f"GPUs on this host (driver {driver}, CUDA {cuda})")  # fmt: skip


@app.command()
def gpus(
    discover: bool = typer.Option(False, "--discover", help="List this host's GPUs via NVML."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Show the GPU catalog, or (--discover) the GPUs on this host."""
    if not discover:
        if json_out:
            typer.echo(json.dumps([_spec_row(s) for s in known_gpus()], indent=2))
        else:
            Console().print(_catalog_table())
        return
    found = discover_gpus()
    driver, cuda = driver_versions()
    if json_out:
        payload = {
            "driver_version": driver,
            "cuda_driver_version": cuda,
            "gpus": [_gpu_row(g) for g in found],
            "topology": topology_matrix(),
        }
        typer.echo(json.dumps(payload, indent=2))
    else:
        console = Console()
        console.print(_host_table(found, driver, cuda, console.width))
