"""The decision log: every scaling action with its reason (`inferplane events`, `status`).

Events are kept in memory (the last `keep`) and appended to STATE/events.jsonl, one JSON
object a line, so another shell reads them while the fleet runs.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

EVENTS_FILE = "events.jsonl"

# kind: scale_up | scale_down | sleep | wake | cold_start | refused | failed
@dataclass(frozen=True)
class ScalingEvent:
    at: float  # time.time()
    model: str
    kind: str
    reason: str
    replicas_before: int
    replicas_after: int
    instance: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class EventLog:
    def __init__(self, path: Path | None = None, keep: int = 200) -> None:
        self.path = path
        self.events: deque[ScalingEvent] = deque(maxlen=keep)

    def add(self, model: str, kind: str, reason: str, before: int, after: int,
            instance: str | None = None) -> ScalingEvent:
        event = ScalingEvent(time.time(), model, kind, reason, before, after, instance)
        self.events.append(event)
        if self.path is not None and self.path.parent.exists():
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(event.to_json()) + "\n")
        return event

    def recent(self, n: int = 20) -> list[dict[str, Any]]:
        return [e.to_json() for e in list(self.events)[-n:]]


def read_events(state_dir: Path, model: str | None = None) -> list[dict[str, Any]]:
    """The events a fleet wrote (oldest first); a torn last line is skipped."""
    path = state_dir / EVENTS_FILE
    if not path.is_file():
        return []
    out: list[dict[str, Any]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and (model is None or event.get("model") == model):
            out.append(event)
    return out
