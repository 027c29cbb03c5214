"""systemd unit-file syntax shared by the systemd renderers: quoting, names, the header."""

from __future__ import annotations

import re

from inferplane.deploy.names import object_name

TARGET = "inferplane.target"
HEADER = "# Rendered by `inferplane render --target systemd`; edit the fleet file instead.\n"
_SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def quote(arg: str) -> str:
    """One argv element in systemd's command-line syntax: `%` and `$` are specifiers and
    variables there, so they are doubled; anything else unusual goes in double quotes."""
    text = arg.replace("%", "%%").replace("$", "$$")
    if text and _SAFE.match(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def unit_name(instance_id: str) -> str:
    return f"inferplane-{object_name(instance_id, max_chars=200)}.service"


def exec_line(argv: list[str]) -> str:
    """An Exec*= value: absolute paths as they are, anything else through /usr/bin/env."""
    first = argv[0] if argv[0].startswith("/") else "/usr/bin/env"
    rest = argv[1:] if argv[0].startswith("/") else argv
    return " ".join([first, *(quote(a) for a in rest)])


def shell_line(script: str) -> str:
    """A multi-line shell script as one `/bin/sh -c` Exec value (units take no newlines)."""
    return f"/bin/sh -c {quote('; '.join(line for line in script.splitlines() if line))}"


__all__ = ["HEADER", "TARGET", "exec_line", "quote", "shell_line", "unit_name"]
