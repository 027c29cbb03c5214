"""What `up` shows while a fleet starts and drains: per instance starting → loading → ready,
then "draining N in-flight requests".

On a terminal it is one live block (Rich), redrawn in place; piped (logs, CI, `up --detach`
behind scripts) it prints one line per change instead, so a log reads like a timeline.
Fed the fleet's status dict (`Runtime.status()` or `state.json`) as often as the caller likes.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

PHASE_STYLE = {
    "starting": "dim", "loading": "yellow", "ready": "green", "restarting": "yellow",
    "unhealthy": "red", "failed": "bold red", "stopped": "dim",
}  # fmt: skip


def instance_phase(inst: dict[str, Any]) -> str:
    """starting (waiting for its turn or spawning) → loading (process up, not ready) → ready;
    else the supervisor's state (restarting, unhealthy, failed, stopped)."""
    state = str(inst.get("state", "?"))
    if state == "starting":
        return "loading" if inst.get("pid") else "starting"
    return state


class FleetProgress:
    def __init__(
        self, console: Console, grace_period_s: float | None = None,
        force_hint: str = "Ctrl-C again forces",
    ) -> None:
        self.console = console
        self.grace_period_s = grace_period_s
        self.force_hint = force_hint
        self._live: Live | None = None
        self._phases: dict[str, str] = {}
        self._since: dict[str, float] = {}
        self._t0 = time.monotonic()
        self._draining_shown: int | None = None
        self._last_drain_line = 0.0

    # ---- feeding ---------------------------------------------------------------------

    def update(self, status: dict[str, Any]) -> None:
        if status.get("phase") in ("draining", "stopped"):
            self._drain(status)
        else:
            self._start(status)

    def close(self) -> None:
        """Stop redrawing (before printing anything else)."""
        if self._live is not None:
            self._live.stop()
            self._live = None

    # ---- start -------------------------------------------------------------------------

    def _start(self, status: dict[str, Any]) -> None:
        now = time.monotonic()
        instances = status.get("instances", [])
        changed = []
        for inst in instances:
            phase = instance_phase(inst)
            if self._phases.get(inst["name"]) != phase:
                self._phases[inst["name"]] = phase
                self._since[inst["name"]] = now
                changed.append(inst)
        if self.console.is_terminal:
            self._show(self._start_block(instances, now))
            return
        for inst in changed:
            self.console.print(self._line(inst, now), highlight=False, soft_wrap=True)

    def _line(self, inst: dict[str, Any], now: float) -> Text:
        phase = self._phases[inst["name"]]
        text = Text(f"{inst['name']}: ")
        text.append(phase, style=PHASE_STYLE.get(phase, ""))
        if phase == "loading" and inst.get("pid"):
            text.append(f" (pid {inst['pid']}, port {inst.get('port')})")
        if phase in ("ready", "failed"):
            text.append(f" after {now - self._t0:.1f} s")
        if phase in ("failed", "unhealthy", "restarting") and inst.get("last_error"):
            text.append(f": {inst['last_error']}")
        return text

    def _start_block(self, instances: list[dict[str, Any]], now: float) -> Group:
        counts: dict[str, int] = {}
        for phase in self._phases.values():
            counts[phase] = counts.get(phase, 0) + 1
        summary = ", ".join(f"{n} {p}" for p, n in sorted(counts.items()))
        head = Spinner(
            "dots", Text(f"starting {len(instances)} engines ({summary}), "
                         f"{now - self._t0:.0f} s"),
        )  # fmt: skip
        grid = Table.grid(padding=(0, 2))
        grid.add_column(overflow="ellipsis", no_wrap=True)
        grid.add_column(no_wrap=True)
        grid.add_column(overflow="ellipsis", no_wrap=True)
        for inst in instances:
            phase = self._phases[inst["name"]]
            detail = f"{now - self._since[inst['name']]:.0f} s"
            if phase in ("failed", "unhealthy", "restarting") and inst.get("last_error"):
                detail = str(inst["last_error"])
            grid.add_row(inst["name"], Text(phase, style=PHASE_STYLE.get(phase, "")), detail)
        return Group(head, grid)

    # ---- drain -------------------------------------------------------------------------

    def _drain(self, status: dict[str, Any]) -> None:
        if status.get("phase") == "stopped":
            self.close()
            if self._draining_shown is not None:
                self.console.print(
                    "drained; engines and gateway stopped", highlight=False, soft_wrap=True
                )
                self._draining_shown = None
            return
        in_flight = int((status.get("gateway") or {}).get("in_flight") or 0)
        grace = status.get("grace_period_s", self.grace_period_s)
        text = (f"draining {in_flight} in-flight request{'s' * (in_flight != 1)}"
                + (f" (grace period {grace:g} s)" if grace is not None else "")
                + f"; {self.force_hint}")  # fmt: skip
        if self.console.is_terminal:
            self._show(Spinner("dots", Text(text)))
        else:
            now = time.monotonic()
            first = self._draining_shown is None
            if first or (in_flight != self._draining_shown and now - self._last_drain_line >= 1):
                self.console.print(text, highlight=False, soft_wrap=True)
                self._last_drain_line = now
            else:
                return
        self._draining_shown = in_flight

    def _show(self, renderable: Any) -> None:
        if self._live is None:
            self._live = Live(renderable, console=self.console, transient=True,
                              refresh_per_second=8)  # fmt: skip
            self._live.start()
        else:
            self._live.update(renderable)
