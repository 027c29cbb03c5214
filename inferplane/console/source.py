"""What the console reads from the fleet runtime (`inferplane.runtime.Runtime` is one).

The console never reaches into the supervisor: it reads the runtime's status (the same
dict `inferplane status` prints from state.json), the plan it runs, and its state
directory (instance logs, scaling events, the control channel `inferplane restart` uses).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from inferplane.planner.plan import Plan
    from inferplane.runtime.state import StateDir


class FleetSource(Protocol):
    @property
    def plan(self) -> Plan | None: ...

    @property
    def state_dir(self) -> StateDir: ...

    def status(self) -> dict[str, Any]: ...
