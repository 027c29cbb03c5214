"""`--help` that reads well at any width: docstrings reflowed, one-line command entries,
no type column on flags.

Typer keeps the hard newlines of a docstring (rich markup mode), so a help text wrapped
at 90 columns in the source came out ragged in a 100-column terminal; the command list
shows a whole first paragraph (`lint` took 9 lines); and typer 0.2x prints `<bool>` in
the type column of every flag, `--help` included, where there is no value to type.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import typer
import typer.core

_SENTENCE_END = re.compile(r"(?<=[a-z0-9)`])\. (?=[A-Z`(])")


def reflow(doc: str) -> str:
    """Paragraphs joined into single lines (blank lines and `\\b` blocks kept)."""
    out = []
    for paragraph in inspect.cleandoc(doc).split("\n\n"):
        if paragraph.startswith("\b"):  # click's marker: keep this block's lines
            out.append(paragraph)
        else:
            out.append(" ".join(line.strip() for line in paragraph.splitlines()))
    return "\n\n".join(out)


def first_sentence(doc: str) -> str:
    paragraph = reflow(doc).split("\n\n")[0]
    return _SENTENCE_END.split(paragraph, maxsplit=1)[0].rstrip(".") + "."


def polish(app: typer.Typer) -> None:
    """Reflowed help and a one-sentence list entry for every command of `app` (and its
    sub-apps), before typer builds the click commands."""
    for info in app.registered_commands:
        doc = info.help or inspect.getdoc(info.callback) or ""
        if doc:
            info.help = reflow(doc)
            info.short_help = info.short_help or first_sentence(doc)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            polish(group.typer_instance)


_display_type_rich = typer.core.TyperOption.display_type_rich


def _flag_has_no_type(self: typer.core.TyperOption, ctx: Any) -> str | None:
    if self.is_flag:
        return None
    return _display_type_rich(self, ctx)


typer.core.TyperOption.display_type_rich = _flag_has_no_type  # type: ignore[method-assign]
