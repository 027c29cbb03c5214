"""vLLM on NVIDIA GPUs: the `Engine` the registry returns for `engine_for("vllm", "gpu")`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from inferplane.engines.base import Endpoints, Engine
from inferplane.engines.metrics import MetricNames
from inferplane.engines.vllm.argv import VllmArgs, build_vllm_argv, check_argv
from inferplane.engines.vllm.defaults import default_batch_limits
from inferplane.engines.vllm.launch import VllmLaunch, supports_shutdown_timeout, supports_sleep
from inferplane.engines.vllm.lora import lora_env
from inferplane.engines.vllm.metrics import VLLM_METRICS
from inferplane.engines.vllm.multinode import (
    DEFAULT_MASTER_PORT,
    DEFAULT_RAY_PORT,
    multinode_argvs,
)
from inferplane.engines.vllm.versions import default_gpu_memory_utilization, era_of


@dataclass(frozen=True)
class VllmEngine:
    kind: str = "vllm"
    device: str = "gpu"
    endpoints: Endpoints = field(default_factory=Endpoints)
    metrics: MetricNames = field(default_factory=lambda: VLLM_METRICS)

    def planned(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> VllmLaunch:
        return VllmLaunch(tuple(argv), dict(env or {}))

    def launches(
        self, args: VllmArgs, *, version: str, spans_nodes: bool = False,
        master_port: int = DEFAULT_MASTER_PORT, ray_port: int = DEFAULT_RAY_PORT,
    ) -> list[VllmLaunch]:
        """The command of every node of one replica (one unless it spans nodes, a node per
        pipeline stage), built once here; the Plan stores their argv."""
        if spans_nodes:
            argvs = multinode_argvs(args, version=version, master_port=master_port,
                                    ray_port=ray_port)
        else:
            argvs = [build_vllm_argv(args, version=version)]
        env = lora_env(args.lora)
        return [VllmLaunch(tuple(argv), dict(env)) for argv in argvs]

    def image(self, version: str, *, fallback: str) -> str:
        return f"vllm/vllm-openai:v{version}"

    def supports_drain_timeout(self, version: str) -> bool:
        return supports_shutdown_timeout(version)

    def supports_sleep(self, version: str) -> bool:
        return supports_sleep(version)

    def batch_defaults(
        self, total_memory_bytes: int, device_name: str | None, max_model_len: int, version: str
    ) -> tuple[int, int]:
        return default_batch_limits(total_memory_bytes, device_name, max_model_len,
                                    era_of(version))

    def default_memory_fraction(self, version: str) -> float:
        return default_gpu_memory_utilization(version)

    def check_argv(self, argv: Sequence[str], version: str) -> None:
        check_argv(list(argv), version)


ENGINE = VllmEngine()
_PROTOCOL: Engine = ENGINE  # mypy checks that it keeps the protocol
