"""Suite-wide guards: tests never write into the working tree or the user's home.

- The per-user registry of running fleets (`inferplane.runtime.registry`) points into a
  temporary directory for the whole session (subprocesses inherit it).
- At the end of the session, fail if the suite created what a user's own runs create in
  the repository: `./.inferplane` (state, logs, the usage database), `./.inferplane-demo`,
  or a database/log file at the top level (issue 18, item 6: a phantom request in
  `inferplane usage` after `scripts/test.sh`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WATCHED = (".inferplane", ".inferplane-demo")


def _top_level_outputs() -> set[tuple[str, int]]:
    """(path, mtime) of every file a stray run writes: so a write into an existing
    `./.inferplane` counts too."""
    found: set[tuple[str, int]] = set()
    for path in REPO.iterdir():
        if path.name in WATCHED and path.is_dir():
            files = [p for p in path.rglob("*") if p.is_file()]
        elif path.name.endswith((".db", ".db-wal", ".log")):
            files = [path]
        else:
            continue
        for file in files:
            try:
                found.add((str(file.relative_to(REPO)), file.stat().st_mtime_ns))
            except OSError:
                continue
    return found


@pytest.fixture(autouse=True, scope="session")
def _isolated_user_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    registry = tmp_path_factory.mktemp("registry")
    saved = os.environ.get("INFERPLANE_REGISTRY_DIR")
    os.environ["INFERPLANE_REGISTRY_DIR"] = str(registry)
    before = _top_level_outputs()
    yield
    if saved is None:
        os.environ.pop("INFERPLANE_REGISTRY_DIR", None)
    else:
        os.environ["INFERPLANE_REGISTRY_DIR"] = saved
    created = sorted({name for name, _ in _top_level_outputs() - before})
    assert not created, (
        f"the tests wrote {created} in {REPO}: use tmp_path (and --state-dir/--db or "
        "cwd=tmp_path for CLI subprocesses)"
    )
