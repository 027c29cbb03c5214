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

from inferplane.errors import InferplaneError
from inferplane.gpus.discovery import DiscoveredGpu, check_free_memory, resolve_visible_devices
from inferplane.runtime.instances import ENGINE_HOST
from inferplane.runtime.process import raise_nofile_limit
from inferplane.spec import EngineSpec, ModelSpec, extra_args_argv

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
    if max_model_len < 1:
        raise InferplaneError(
            "max_model_len must be positive", field=f"models.{model.name}.max_model_len",
            value=max_model_len, fix="use the planner's context length",
        )
    if not 0 < gpu_memory_utilization <= 1:
        raise InferplaneError(
            "gpu_memory_utilization is a fraction of the card",
            field=f"models.{model.name}.gpu_memory_utilization",
            value=gpu_memory_utilization, fix="use a value in (0, 1]",
        )
    argv = [
        vllm, "serve", model.source,
        "--served-model-name", model.engine_model_name,
        "--host", host,
        "--port", str(port),
        "--max-model-len", str(max_model_len),
        "--tensor-parallel-size", str(tensor_parallel_size),
        "--gpu-memory-utilization", f"{gpu_memory_utilization:g}",
    ]
    if model.max_num_seqs is not None:
        argv += ["--max-num-seqs", str(model.max_num_seqs)]
    if model.max_num_batched_tokens is not None:
        argv += ["--max-num-batched-tokens", str(model.max_num_batched_tokens)]
    if model.dtype != "auto":
        argv += ["--dtype", model.dtype]
    if model.quantization is not None:
        argv += ["--quantization", model.quantization]
    if model.kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", model.kv_cache_dtype]
    if model.kv_cache_memory_gib is not None:
        argv += ["--kv-cache-memory-bytes", str(int(model.kv_cache_memory_gib * 2**30))]
    if model.enforce_eager:
        argv.append("--enforce-eager")
    if model.task == "embed":
        argv += ["--runner", "pooling"]
    argv += extra_args_argv(model.extra_args)
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
