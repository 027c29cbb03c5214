"""Options shared by several commands (light: imported when the CLI starts)."""

from __future__ import annotations

from typing import Any

import typer

STATE_DIR_ENV = "INFERPLANE_STATE_DIR"  # = inferplane.runtime.registry.STATE_DIR_ENV


def state_dir_option() -> Any:
    """--state-dir for the commands that act on a running fleet (resolution order in
    `inferplane.runtime.registry`)."""
    return typer.Option(
        None, "--state-dir", envvar=STATE_DIR_ENV, show_default=False,
        help="The fleet's state directory (default: $INFERPLANE_STATE_DIR, ./.inferplane "
        "when a fleet runs from it, else the one running fleet of this user).",
    )
