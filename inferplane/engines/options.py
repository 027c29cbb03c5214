"""Engine options as command-line flags: the rendering every engine's launcher shares.

`extra_args:` in the fleet file (validated in `spec/extra_args.py`) arrives here as plain
data; only an engine turns it into argv items.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

Scalar = str | int | float | bool
ExtraArgValue = Scalar | list[Scalar] | dict[str, Any]


def extra_args_argv(args: Mapping[str, ExtraArgValue]) -> list[str]:
    """The argv tail for `extra_args`: true -> `--flag`, false -> `--no-flag`, list -> `--flag a
    b`, mapping -> `--flag '{json}'` (one argv item, so no shell or YAML quoting can break it, P05).
    """
    argv: list[str] = []
    for flag, value in args.items():
        if value is True:
            argv.append(f"--{flag}")
        elif value is False:
            argv.append(f"--no-{flag}")
        elif isinstance(value, list):
            argv.append(f"--{flag}")
            argv.extend(_scalar_text(item) for item in value)
        elif isinstance(value, dict):
            argv.extend([f"--{flag}", json.dumps(value, separators=(",", ":"))])
        else:
            argv.extend([f"--{flag}", _scalar_text(value)])
    return argv


def _scalar_text(value: Scalar) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def option_value(argv: tuple[str, ...] | list[str], name: str) -> str | None:
    """The value of `--name VALUE` or `--name=VALUE` in `argv`; "" for a bare `--name`."""
    flag = f"--{name}"
    for i, item in enumerate(argv):
        if item == flag:
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            return "" if nxt.startswith("--") else nxt
        if item.startswith(flag + "="):
            return item[len(flag) + 1 :]
    return None


def with_option(argv: tuple[str, ...], name: str, value: str | None, *,
                add: bool = True) -> tuple[str, ...]:
    """`argv` with `--name` set to `value` (None: a bare switch): replaced in place when
    present, appended when absent and `add`."""
    flag = f"--{name}"
    out = list(argv)
    for i, item in enumerate(out):
        if item == flag:
            if value is not None and i + 1 < len(out) and not out[i + 1].startswith("--"):
                out[i + 1] = value
            return tuple(out)
        if item.startswith(flag + "="):
            out[i] = flag if value is None else f"{flag}={value}"
            return tuple(out)
    if not add:
        return argv
    return (*out, flag) if value is None else (*out, flag, value)
