"""A pod's own per-replica cap: `--max-num-seqs` of the container behind the endpoint.

The cap is read from the pod spec (what the engine really runs with: the plan's value as
rendered, a hand edit, a hand-written manifest alike), from the container that exposes the
endpoint's port. None when the pod says nothing (the model's default cap applies).
"""

from __future__ import annotations

from typing import Any

from inferplane.engines import engine_for


def _flag_value(argv: list[str]) -> int | None:
    # the engine reads its own command line (both `--flag N` and `--flag=N`)
    text = engine_for("vllm").planned(argv).flag("max-num-seqs")
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value > 0 else None


def max_num_seqs(pod: Any, port: int) -> int | None:
    """`pod` is a `V1Pod`; `port` the endpoint's (container) port."""
    containers = (pod.spec.containers if pod.spec is not None else None) or []
    serving = [c for c in containers if any(p.container_port == port for p in c.ports or [])]
    for c in serving or (containers if len(containers) == 1 else []):
        value = _flag_value([*(c.command or []), *(c.args or [])])
        if value is not None:
            return value
    return None
