"""A vLLM-compatible engine simulator: same HTTP API and metrics, roofline timing."""

from inferplane.engines.sim.config import FaultConfig, SimEngineConfig
from inferplane.engines.sim.host import (
    EngineHandle,
    EngineHost,
    start_engine,
    start_engines,
    stop_engines,
)

__all__ = [
    "EngineHandle",
    "EngineHost",
    "FaultConfig",
    "SimEngineConfig",
    "start_engine",
    "start_engines",
    "stop_engines",
]
