"""Finding the running fleet from any shell: `--state-dir`, `$INFERPLANE_STATE_DIR`, then a
per-user registry of running fleets.

Every `up` records its state directory in the registry while it runs (one small file per
fleet under `$INFERPLANE_REGISTRY_DIR`, else `$XDG_STATE_HOME/inferplane/fleets`, else
`~/.local/state/inferplane/fleets`), so `status`, `down`, `logs`, `restart`, `keys`,
`usage` and `routes` find it without retyping paths:

1. `--state-dir DIR` (also read from `$INFERPLANE_STATE_DIR`);
2. `./.inferplane` when a fleet runs from it;
3. the only running fleet in the registry (several: an error naming each);
4. `./.inferplane` (whatever it holds; the commands say when it holds nothing).

Entries of fleets that died without cleaning up (kill -9) are ignored and removed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from inferplane.errors import InferplaneError
from inferplane.runtime.state import DEFAULT_STATE_DIR, StateDir

STATE_DIR_ENV = "INFERPLANE_STATE_DIR"
REGISTRY_DIR_ENV = "INFERPLANE_REGISTRY_DIR"


def registry_dir() -> Path:
    explicit = os.environ.get(REGISTRY_DIR_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "inferplane" / "fleets"


def _entry(state: StateDir) -> Path:
    key = hashlib.sha256(str(state.path.resolve()).encode()).hexdigest()[:16]
    return registry_dir() / f"{key}.json"


def register(state: StateDir, pid: int) -> None:
    """Record that `pid` runs a fleet from `state` (best effort: never fails a start)."""
    with contextlib.suppress(OSError):
        path = _entry(state)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_suffix(f".{pid}.tmp")
        tmp.write_text(json.dumps({"state_dir": str(state.path.resolve()), "pid": pid}) + "\n")
        os.replace(tmp, path)


def unregister(state: StateDir) -> None:
    with contextlib.suppress(OSError):
        _entry(state).unlink(missing_ok=True)


def running_fleets() -> list[StateDir]:
    """State directories with a live `up`, oldest entry first; stale entries are removed."""
    try:
        entries = sorted(registry_dir().glob("*.json"), key=lambda p: p.stat().st_mtime)
    except OSError:
        return []
    found: list[StateDir] = []
    for entry in entries:
        try:
            data: dict[str, Any] = json.loads(entry.read_text())
            state = StateDir(Path(data["state_dir"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if state.running_pid() is None:
            with contextlib.suppress(OSError):
                entry.unlink()
            continue
        found.append(state)
    return found


def find_state_dir(explicit: Path | None = None) -> StateDir:
    """The state directory a command other than `up` works on (see the module docstring)."""
    if explicit is None and os.environ.get(STATE_DIR_ENV):
        explicit = Path(os.environ[STATE_DIR_ENV])
    if explicit is not None:
        return StateDir(explicit.expanduser().resolve())
    local = StateDir(DEFAULT_STATE_DIR.resolve())
    if local.running_pid() is not None:
        return local
    fleets = running_fleets()
    if len(fleets) == 1:
        return fleets[0]
    if len(fleets) > 1:
        dirs = ", ".join(str(s.path) for s in fleets)
        raise InferplaneError(
            f"{len(fleets)} fleets are running ({dirs})", field="--state-dir",
            fix="pick one with --state-dir DIR (or $INFERPLANE_STATE_DIR)",
        )
    return local


def up_state_dir(explicit: Path | None = None) -> StateDir:
    """The state directory `up` runs from: --state-dir / $INFERPLANE_STATE_DIR / .inferplane."""
    if explicit is None and os.environ.get(STATE_DIR_ENV):
        explicit = Path(os.environ[STATE_DIR_ENV])
    return StateDir((explicit or DEFAULT_STATE_DIR).expanduser().resolve())
