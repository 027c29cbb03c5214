"""Runtime defaults the CLI needs at start-up (no imports: `inferplane --help` stays fast)."""

from __future__ import annotations

# How long in-flight requests may finish on stop (P27); `inferplane.runtime.drain` uses it.
DEFAULT_GRACE_PERIOD_S = 300.0
