"""The elastic fleet: the local autoscaler and the sleep/wake swapper (docs/scaling.md).

`policy` decides (pure: observations and a clock in, decisions with reasons out);
`controller` observes a running fleet and acts through the runtime; `events` keeps the
decision log `inferplane events` and `status` show; `metrics` exports the autoscaler's
state to Prometheus; `ledger` is the GPU-share arithmetic that decides who must yield.
"""

from inferplane.scaling.events import EventLog, ScalingEvent
from inferplane.scaling.policy import Decision, ModelAutoscaler, Observation

__all__ = ["Decision", "EventLog", "ModelAutoscaler", "Observation", "ScalingEvent"]
