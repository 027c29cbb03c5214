"""Fleet -> the engine instances `inferplane up` runs on this host (one process each, P23).

`engine: sim` fleets are turned into instances here - from the plan when the fleet lists
its GPUs (each simulated engine then gets the plan's GPU type, TP, utilization, KV pool,
max_num_seqs and batch budget, so it queues and preempts where the planned vLLM would) -
and `engine: vllm` fleets come from a plan (`inferplane.runtime.vllm_fleet`). Endpoint-only
models get no instance; the gateway routes to their URLs directly.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from inferplane.engines.simulator import SimFaults, SimLaunchArgs
from inferplane.engines.simulator import sim_argv as build_sim_argv
from inferplane.engines.vllm.lora import lora_env
from inferplane.errors import InferplaneError
from inferplane.gpus.catalog import find_gpu
from inferplane.planner.lora import lora_args
from inferplane.planner.plan import Plan, PlanInstance
from inferplane.sim.config import DEFAULT_GPU, FaultConfig
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
    node: str = ""  # the plan's node: with several, the indices alone repeat across nodes
    gpu_uuids: tuple[str, ...] = ()  # when the plan knows them: the stable identity (P20)
    gpu_memory_utilization: float = 0.0  # share of each whole card the instance takes
    start_after: tuple[str, ...] = ()  # instances that must be ready before this one starts
    startup_deadline_s: float | None = None  # None: the supervisor's default
    # CPU engines (engine device cpu): the cores they bind and the host RAM they take.
    cpu_cores: tuple[int, ...] = ()
    host_memory_bytes: int = 0

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
    planned: PlanInstance | None = None,
) -> tuple[str, ...]:
    """The command line of one simulated engine (`inferplane sim`) serving `model`; with
    `planned`, the plan's numbers instead of the fleet file's (the simulator engine builds it)."""
    source = Path(model.source) if model.source is not None else None
    model_dir = str(source) if source is not None and (source / "config.json").is_file() else None
    if planned is not None:
        sizing = SimLaunchArgs(
            served_model_name=model.engine_model_name, host=ENGINE_HOST, port=port, gpu=gpu,
            max_model_len=planned.max_model_len,
            tensor_parallel_size=planned.tensor_parallel_size,
            max_num_seqs=planned.max_num_seqs,
            max_num_batched_tokens=planned.max_num_batched_tokens,
            gpu_memory_utilization=planned.gpu_memory_utilization,
            kv_cache_memory_bytes=planned.kv_cache_memory_bytes,
        )
    else:
        sizing = SimLaunchArgs(
            served_model_name=model.engine_model_name, host=ENGINE_HOST, port=port, gpu=gpu,
            max_model_len=model.max_model_len if isinstance(model.max_model_len, int) else None,
            tensor_parallel_size=(model.tensor_parallel_size
                                  if isinstance(model.tensor_parallel_size, int) else None),
            max_num_seqs=model.max_num_seqs,
            max_num_batched_tokens=model.max_num_batched_tokens,
            gpu_memory_utilization=(model.gpu_memory_utilization
                                    if isinstance(model.gpu_memory_utilization, float) else None),
        )
    fault = None if faults is None else SimFaults(
        load_time_s=faults.load_time_s, fail_rate=faults.fail_rate, slowdown=faults.slowdown,
        crash_after_requests=faults.crash_after_requests,
        hang_after_requests=faults.hang_after_requests,
        die_after_tokens=faults.die_after_tokens,
    )
    args = replace(sizing, model_dir=model_dir, task=model.task,
                   extra_args=dict(model.extra_args), faults=fault, lora=lora_args(model))
    return build_sim_argv(args, python=python)


def sim_lora_env(model: ModelSpec) -> dict[str, str]:
    """The variables a simulated engine of `model` needs for LoRA (run-time loading)."""
    return lora_env(lora_args(model))


def plan_sim_instances(
    fleet: FleetSpec,
    *,
    faults: Mapping[str, FaultConfig] | None = None,
    port_picker: Callable[[], int] = free_port,
    plan: Plan | None = None,
) -> list[Instance]:
    """One instance per replica of every placed model of an `engine: sim` fleet (per
    planned instance when `plan` is given).

    `faults` maps an instance name ("<model>-<replica>") or a model name to simulated
    misbehaviour (tests and demos of supervision).
    """
    if fleet.engine.kind != "sim":
        return []
    if plan is not None:
        return _from_plan(fleet, plan, faults or {}, port_picker)
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
                    env={**env, **sim_lora_env(model), **model.env},
                )
            )
    return instances


def plan_simulated(fleet: FleetSpec, given: Plan | None, fleet_file: str) -> Plan | None:
    """An `engine: sim` fleet that lists its GPUs is planned like a real one (or runs the
    plan it was given); one with `gpus: discover` has no GPUs to plan on and runs each
    model as the fleet file says."""
    if fleet.engine.kind != "sim" or fleet.gpus is None or not fleet.placed_models:
        return None
    if given is not None:
        from inferplane.runtime.vllm_fleet import check_plan_matches

        check_plan_matches(given, fleet)
        return given
    from inferplane.planner.build import plan_fleet  # heavy: only when planning

    return plan_fleet(fleet, fleet_file=fleet_file)


def _from_plan(
    fleet: FleetSpec,
    plan: Plan,
    faults: Mapping[str, FaultConfig],
    port_picker: Callable[[], int],
) -> list[Instance]:
    """One simulated engine per planned instance, started in the plan's order (co-located
    instances after the ones they share a card with, as vLLM needs)."""
    env = dict(fleet.engine.extra_env)
    instances: list[Instance] = []
    for planned in plan.instances:
        if planned.spans_nodes:
            raise InferplaneError(
                f"{planned.model} spans {planned.pipeline_parallel_size} nodes; the simulator "
                "runs one process per replica on this host",
                field=f"models.{planned.model}.pipeline_parallel_size",
                value=planned.pipeline_parallel_size,
                fix="use pipeline_parallel_size: 1 for the simulated fleet",
            )
        model = fleet.model(planned.model)
        assert model is not None
        port = port_picker()
        fault = faults.get(planned.id) or faults.get(planned.model)
        instances.append(Instance(
            name=planned.id,
            model=planned.model,
            served_name=planned.served_model_name,
            replica=planned.replica,
            port=port,
            engine="sim",
            argv=sim_argv(model, port=port, gpu=planned.gpu_type, faults=fault,
                          planned=planned),
            env={**env, **sim_lora_env(model), **model.env},
            gpu_indices=tuple(planned.gpu_indices), node=planned.node,
            gpu_memory_utilization=planned.gpu_memory_utilization,
            start_after=tuple(planned.start_after),
        ))
    return instances

