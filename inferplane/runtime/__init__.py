"""Running a fleet on one host: engine processes, supervision, drain, the gateway in front.

The names below load on first use (PEP 562): `inferplane.runtime.state` and the CLI's
other light helpers must not pull in the gateway, uvicorn and the store with them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inferplane.runtime.instances import Instance, plan_sim_instances
    from inferplane.runtime.runner import Runtime, RuntimeOptions
    from inferplane.runtime.supervisor import Supervised, Supervisor, SupervisorSettings
    from inferplane.runtime.vllm_fleet import plan_vllm_instances, startup_deadline_s

_WHERE = {
    "Instance": "instances",
    "plan_sim_instances": "instances",
    "Runtime": "runner",
    "RuntimeOptions": "runner",
    "Supervised": "supervisor",
    "Supervisor": "supervisor",
    "SupervisorSettings": "supervisor",
    "plan_vllm_instances": "vllm_fleet",
    "startup_deadline_s": "vllm_fleet",
}

__all__ = [
    "Instance",
    "Runtime",
    "RuntimeOptions",
    "Supervised",
    "Supervisor",
    "SupervisorSettings",
    "plan_sim_instances",
    "plan_vllm_instances",
    "startup_deadline_s",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"inferplane.runtime.{module}"), name)
    globals()[name] = value
    return value
