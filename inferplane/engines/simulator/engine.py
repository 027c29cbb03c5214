"""The simulator as an `Engine` (`engine_for("sim")`): vLLM's endpoints, metric names, batch
defaults and flag rules (it is sized and checked as vLLM), its own launcher (`launch.py`), no
image of its own (it ships in the project's image).

A Plan made for an `engine: sim` fleet holds vLLM's command (the planner sizes it as vLLM),
so `planned` wraps it as vLLM's launch; `inferplane up` runs `sim_argv` instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferplane.engines.base import Engine
from inferplane.engines.vllm.engine import VllmEngine


@dataclass(frozen=True)
class SimEngine(VllmEngine):
    kind: str = "sim"
    device: str = "gpu"  # a simulated GPU of the catalog

    def image(self, version: str, *, fallback: str) -> str:
        return fallback

    def supports_drain_timeout(self, version: str) -> bool:
        return False  # the simulator stops at once on SIGTERM

    def supports_sleep(self, version: str) -> bool:
        return True  # sleep mode is simulated whatever vLLM release the fleet names


ENGINE = SimEngine()
_PROTOCOL: Engine = ENGINE  # mypy checks that it keeps the protocol
