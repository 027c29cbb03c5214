"""The simulator as an `Engine` (`engine_for("sim")`): vLLM's endpoints and metric names,
its own launcher (`launch.py`), no image of its own (it ships in the project's image).

A Plan made for an `engine: sim` fleet holds vLLM's command (the planner sizes it as vLLM),
so `planned` wraps it as vLLM's launch; `inferplane up` runs `sim_argv` instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from inferplane.engines.base import Endpoints, Engine
from inferplane.engines.metrics import MetricNames
from inferplane.engines.vllm.argv import check_argv
from inferplane.engines.vllm.defaults import default_batch_limits
from inferplane.engines.vllm.launch import VllmLaunch
from inferplane.engines.vllm.metrics import VLLM_METRICS
from inferplane.engines.vllm.versions import default_gpu_memory_utilization, era_of


@dataclass(frozen=True)
class SimEngine:
    kind: str = "sim"
    device: str = "gpu"  # a simulated GPU of the catalog
    endpoints: Endpoints = field(default_factory=Endpoints)
    metrics: MetricNames = field(default_factory=lambda: VLLM_METRICS)

    def planned(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> VllmLaunch:
        return VllmLaunch(tuple(argv), dict(env or {}))

    def image(self, version: str, *, fallback: str) -> str:
        return fallback

    def supports_drain_timeout(self, version: str) -> bool:
        return False  # the simulator stops at once on SIGTERM

    def supports_sleep(self, version: str) -> bool:
        return True

    def batch_defaults(
        self, total_memory_bytes: int, device_name: str | None, max_model_len: int, version: str
    ) -> tuple[int, int]:
        return default_batch_limits(total_memory_bytes, device_name, max_model_len,
                                    era_of(version))

    def default_memory_fraction(self, version: str) -> float:
        return default_gpu_memory_utilization(version)

    def check_argv(self, argv: Sequence[str], version: str) -> None:
        check_argv(list(argv), version)


ENGINE = SimEngine()
_PROTOCOL: Engine = ENGINE  # mypy checks that it keeps the protocol
