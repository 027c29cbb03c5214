"""The OpenAI-compatible gateway: routing, streaming, balancing, admission, metrics.

Embedding it (what the runtime does):

    from inferplane.gateway import Backend, GatewayConfig, ModelRoute, build_app
    app = build_app(GatewayConfig(models=(ModelRoute("llama-8b"),)))
    app.state.set_backends("llama-8b", [Backend("http://127.0.0.1:8001", ready=True)])
    # serve `app` with any ASGI server (see inferplane.gateway.server)
"""

from inferplane.gateway.app import GatewayApp, build_app
from inferplane.gateway.backend import Backend, EngineLoad
from inferplane.gateway.config import (
    Admission,
    GatewayConfig,
    LongPromptLane,
    ModelRoute,
    Timeouts,
    WeightedRoute,
    WeightedTarget,
)
from inferplane.gateway.state import GatewayState

__all__ = [
    "Admission",
    "Backend",
    "EngineLoad",
    "GatewayApp",
    "GatewayConfig",
    "GatewayState",
    "LongPromptLane",
    "ModelRoute",
    "Timeouts",
    "WeightedRoute",
    "WeightedTarget",
    "build_app",
]
