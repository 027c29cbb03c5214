"""The engine boundary: every serving engine inferplane runs, behind one `Engine` protocol.

    engine = engine_for(fleet.engine.kind)            # device "gpu" unless given
    spec = engine.planned(inst.argv, inst.env).with_host("0.0.0.0")
    reading = read_metrics(text, engine.metrics)      # neutral names (engines/metrics.py)

An engine is a folder here (`vllm/`, `simulator/`) plus one line in `_ENGINES`, keyed by
(kind, device): a new device of an existing engine (vLLM on CPU) is one module and one
line (docs/engines.md). Modules are imported when first asked for, so `inferplane.engines`
stays cheap to import. This package imports only the ground floor (`inferplane.errors`,
`inferplane.models`, `inferplane.gpus`); tests/test_engine_boundary.py keeps it so.
"""

from __future__ import annotations

from importlib import import_module

from inferplane.engines.base import LEADER_ADDRESS_TOKEN, Endpoints, Engine, LaunchSpec
from inferplane.engines.metrics import MetricNames, Reading, read_metrics
from inferplane.errors import InferplaneError

DEFAULT_DEVICE = "gpu"

# (kind, device) -> "module:attribute" of the Engine instance.
_ENGINES: dict[tuple[str, str], str] = {
    ("vllm", "gpu"): "inferplane.engines.vllm.engine:ENGINE",
    ("sim", "gpu"): "inferplane.engines.simulator.engine:ENGINE",
}


def engine_for(kind: str, device: str = DEFAULT_DEVICE) -> Engine:
    """The engine serving `engine: {kind, device}`; raises naming the known pairs."""
    target = _ENGINES.get((kind, device))
    if target is None:
        known = ", ".join(f"{k}/{d}" for k, d in sorted(_ENGINES))
        raise InferplaneError(
            f"no engine {kind!r} for device {device!r}", field="engine",
            value=f"{kind}/{device}", fix=f"use one of: {known}",
        )
    module, _, attr = target.partition(":")
    engine: Engine = getattr(import_module(module), attr)
    return engine


def engines() -> list[tuple[str, str]]:
    """Every registered (kind, device), sorted."""
    return sorted(_ENGINES)


__all__ = [
    "DEFAULT_DEVICE", "LEADER_ADDRESS_TOKEN", "Endpoints", "Engine", "LaunchSpec",
    "MetricNames", "Reading", "engine_for", "engines", "read_metrics",
]
