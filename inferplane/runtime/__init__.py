"""Running a fleet on one host: engine processes, supervision, drain, the gateway in front."""

from inferplane.runtime.instances import Instance, plan_sim_instances
from inferplane.runtime.runner import Runtime, RuntimeOptions
from inferplane.runtime.supervisor import Supervised, Supervisor, SupervisorSettings
from inferplane.runtime.vllm_fleet import plan_vllm_instances, startup_deadline_s

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
