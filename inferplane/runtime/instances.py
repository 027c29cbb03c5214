"""Fleet -> the engine instances `inferplane up` runs on this host (one process each, P23).

`engine: sim` fleets are turned into instances here; `engine: vllm` fleets come from a
plan (`inferplane.runtime.vllm_fleet`). Endpoint-only models get no instance; the gateway
routes to their URLs directly.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from inferplane.engines.sim.config import DEFAULT_GPU, FaultConfig
from inferplane.gpus.catalog import find_gpu
from inferplane.spec import FleetSpec, ModelSpec

ENGINE_HOST = "127.0.0.1"


@dataclass(frozen=True)
class Instance:
    """One engine process: replica `replica` of fleet model `model`, listening on `port`."""

    name: str  # unique per fleet: "<model>-<replica>"
    model: str  # the fleet's (client-facing, canonical) model name
    served_name: str  # the engine's --served-model-name (P36)
    replica: int
    port: int
    engine: str  # "sim" | "vllm"
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    host: str = ENGINE_HOST
    # vLLM instances (from the plan): where they run and how they start.
    gpu_indices: tuple[int, ...] = ()  # NVML indices (resolved from gpu_uuids before a start)
    gpu_uuids: tuple[str, ...] = ()  # when the plan knows them: the stable identity (P20)
    gpu_memory_utilization: float = 0.0  # share of each whole card the instance takes
    start_after: tuple[str, ...] = ()  # instances that must be ready before this one starts
    startup_deadline_s: float | None = None  # None: the supervisor's default

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def free_port(host: str = ENGINE_HOST) -> int:
    """A port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _sim_gpu(fleet: FleetSpec) -> str:
    if fleet.gpus is not None:
        gpu_type = fleet.gpus.nodes[0].gpu_type
        if find_gpu(gpu_type) is not None:
            return gpu_type
    return DEFAULT_GPU


def sim_argv(
    model: ModelSpec,
    *,
    port: int,
    gpu: str,
    faults: FaultConfig | None = None,
    python: str = sys.executable,
) -> tuple[str, ...]:
    """The command line of one simulated engine (`inferplane sim`) serving `model`."""
    argv = [
        python, "-m", "inferplane", "sim",
        "--model", model.engine_model_name,
        "--host", ENGINE_HOST,
        "--port", str(port),
        "--gpu", gpu,
    ]
    source = Path(model.source) if model.source is not None else None
    if source is not None and (source / "config.json").is_file():
        argv += ["--model-dir", str(source)]
    if isinstance(model.max_model_len, int):
        argv += ["--max-model-len", str(model.max_model_len)]
    if isinstance(model.tensor_parallel_size, int):
        argv += ["--tensor-parallel-size", str(model.tensor_parallel_size)]
    if model.max_num_seqs is not None:
        argv += ["--max-num-seqs", str(model.max_num_seqs)]
    if model.max_num_batched_tokens is not None:
        argv += ["--max-num-batched-tokens", str(model.max_num_batched_tokens)]
    if isinstance(model.gpu_memory_utilization, float):
        argv += ["--gpu-memory-utilization", str(model.gpu_memory_utilization)]
    if faults is not None:
        argv += ["--load-time-s", str(faults.load_time_s), "--fail-rate", str(faults.fail_rate)]
        argv += ["--slowdown", str(faults.slowdown)]
        if faults.crash_after_requests is not None:
            argv += ["--crash-after-requests", str(faults.crash_after_requests)]
        if faults.hang_after_requests is not None:
            argv += ["--hang-after-requests", str(faults.hang_after_requests)]
    return tuple(argv)


def plan_sim_instances(
    fleet: FleetSpec,
    *,
    faults: Mapping[str, FaultConfig] | None = None,
    port_picker: Callable[[], int] = free_port,
) -> list[Instance]:
    """One instance per replica of every placed model of an `engine: sim` fleet.

    `faults` maps an instance name ("<model>-<replica>") or a model name to simulated
    misbehaviour (tests and demos of supervision).
    """
    if fleet.engine.kind != "sim":
        return []
    gpu = _sim_gpu(fleet)
    env = dict(fleet.engine.extra_env)
    instances: list[Instance] = []
    for model in fleet.placed_models:
        for replica in range(model.replicas):
            name = f"{model.name}-{replica}"
            port = port_picker()
            fault = (faults or {}).get(name) or (faults or {}).get(model.name)
            instances.append(
                Instance(
                    name=name,
                    model=model.name,
                    served_name=model.engine_model_name,
                    replica=replica,
                    port=port,
                    engine="sim",
                    argv=sim_argv(model, port=port, gpu=gpu, faults=fault),
                    env={**env, **model.env},
                )
            )
    return instances
