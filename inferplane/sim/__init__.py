"""A vLLM-compatible engine simulator: same HTTP API and metrics, roofline timing."""

from inferplane.sim.config import FaultConfig, SimEngineConfig
from inferplane.sim.host import (
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
