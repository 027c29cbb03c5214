"""Building blocks for launching `vllm serve` on pinned GPUs (wired up once plans exist).

    gpus = discover_gpus(nvml)
    launch = build_vllm_command(model, gpu_ids=["GPU-3f…", "1"], gpus=gpus, port=8001,
                                max_model_len=32768, tensor_parallel_size=2,
                                gpu_memory_utilization=0.9)
    preflight_gpus(launch.gpu_indices, gpus, 0.9)   # refuses, naming who holds memory
    raise_nofile_limit()
    await spawn(launch.argv, launch.env, log)        # own process group
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from inferplane.engines.vllm import VllmArgs, build_vllm_argv
from inferplane.errors import InferplaneError
from inferplane.gpus.discovery import DiscoveredGpu, check_free_memory, resolve_visible_devices
from inferplane.runtime.instances import ENGINE_HOST
from inferplane.runtime.process import raise_nofile_limit
from inferplane.spec import DEFAULT_VLLM_VERSION, EngineSpec, ModelSpec

__all__ = ["VllmLaunch", "build_vllm_command", "preflight_gpus", "raise_nofile_limit"]


@dataclass(frozen=True)
class VllmLaunch:
    """argv and the environment overlay for one vLLM instance."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    gpu_indices: tuple[int, ...]


def build_vllm_command(
    model: ModelSpec,
    *,
    gpu_ids: list[str],
    gpus: list[DiscoveredGpu],
    port: int,
    max_model_len: int,
    tensor_parallel_size: int,
    gpu_memory_utilization: float,
    engine: EngineSpec | None = None,
    host: str = ENGINE_HOST,
    vllm: str = "vllm",
) -> VllmLaunch:
    """`vllm serve` for `model` on the GPUs `gpu_ids` (UUIDs or indices).

    CUDA_VISIBLE_DEVICES is always set, to NVML indices (P20, P21), with
    CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA numbers GPUs as NVML does. `--max-model-len` is
    always explicit (the planner's number, never vLLM's default of the model's maximum).
    The argv comes from `inferplane.engines.vllm.build_vllm_argv` (version-aware flags, P32).
    """
    if model.source is None:
        raise InferplaneError(
            "a model served elsewhere (endpoints) is never launched", field="models",
            value=model.name, fix="give it source: to run it here",
        )
    indices = resolve_visible_devices(gpu_ids, gpus)
    if len(indices) != tensor_parallel_size:
        raise InferplaneError(
            f"tensor_parallel_size {tensor_parallel_size} needs as many GPUs, "
            f"got {len(indices)}",
            field=f"models.{model.name}.tensor_parallel_size",
            value=gpu_ids,
            fix="assign exactly tensor_parallel_size GPUs to the instance",
        )
    argv = build_vllm_argv(
        VllmArgs(
            source=model.source,
            served_model_name=model.engine_model_name,
            host=host,
            port=port,
            max_model_len=max_model_len,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            max_num_seqs=model.max_num_seqs,
            max_num_batched_tokens=model.max_num_batched_tokens,
            dtype=model.dtype,
            quantization=model.quantization,
            kv_cache_dtype=model.kv_cache_dtype,
            kv_cache_memory_bytes=(
                int(model.kv_cache_memory_gib * 2**30)
                if model.kv_cache_memory_gib is not None else None
            ),
            enforce_eager=model.enforce_eager,
            task=model.task,
            extra_args=model.extra_args,
        ),
        version=engine.version if engine is not None else DEFAULT_VLLM_VERSION,
        vllm=vllm,
    )
    env: dict[str, str] = {}
    if engine is not None:
        env.update(engine.extra_env)
    env.update(model.env)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in indices)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return VllmLaunch(tuple(argv), env, tuple(indices))


def preflight_gpus(
    indices: tuple[int, ...] | list[int], gpus: list[DiscoveredGpu], gpu_memory_utilization: float
) -> None:
    """Refuse to start unless each target GPU has the memory the instance will take
    (utilization × total) free; the error names the processes holding it (P19, P22)."""
    by_index = {gpu.index: gpu for gpu in gpus}
    for index in indices:
        gpu = by_index.get(index)
        if gpu is None:
            raise InferplaneError(
                "no such GPU on this host", field="gpu", value=index,
                fix="use an index from `inferplane gpus --discover`",
            )
        check_free_memory(gpu, int(gpu.total_bytes * gpu_memory_utilization))
