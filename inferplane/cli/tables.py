"""Tables that degrade gracefully in a narrow terminal or a pipe (80 columns).

A `Col` says how to shrink it: a short header, and a drop rank (the highest rank goes
first; 0 is never dropped). `fitted_table` measures the cells, switches to the short
headers, then drops columns until the table fits the console's width, and names what it
hid in the caption (`--json` has everything). Cells never wrap unless their column allows
it (lists, one item per line); a cell that still does not fit ends with an ellipsis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rich.cells import cell_len
from rich.table import Table


@dataclass(frozen=True)
class Col:
    header: str
    short: str | None = None  # the header when the full one does not fit
    drop: int = 0  # 0: always shown; otherwise the highest rank is hidden first
    justify: Literal["left", "right"] = "left"
    wrap: bool = False  # may break over lines (at spaces and newlines in the cell)


def _widths(
    headers: Sequence[str], rows: Sequence[Sequence[str]], wrap: Sequence[bool]
) -> list[int]:
    widths = []
    for i, header in enumerate(headers):
        cells = [row[i] for row in rows]
        # a wrapping column needs only its longest line (newlines split it)
        lines = [ln for cell in cells for ln in cell.splitlines() or [""]] if wrap[i] else cells
        widths.append(max([cell_len(header), *(cell_len(x) for x in lines)]))
    return widths


def measure(columns: Sequence[Col], rows: Sequence[Sequence[str]]) -> list[int]:
    """Each column's width with its full header."""
    return _widths([c.header for c in columns], rows, [c.wrap for c in columns])


def table_width(widths: Sequence[int]) -> int:
    """Rich's default box: one space of padding each side and one border per column, +1."""
    return sum(w + 3 for w in widths) + 1


def fitted_table(
    columns: Sequence[Col],
    rows: Sequence[Sequence[str]],
    width: int,
    title: str | None = None,
) -> Table:
    keep = list(range(len(columns)))
    headers = [c.header for c in columns]

    def total() -> int:
        return table_width(_widths([headers[i] for i in keep], [[r[i] for i in keep] for r in rows],
                                   [columns[i].wrap for i in keep]))  # fmt: skip

    if total() > width:
        headers = [c.short or c.header for c in columns]
    hidden: list[str] = []
    while total() > width:
        droppable = [i for i in keep if columns[i].drop > 0]
        if not droppable:
            break
        worst = max(droppable, key=lambda i: (columns[i].drop, i))
        keep.remove(worst)
        hidden.append(columns[worst].header)
    table = Table(
        title=title, title_justify="left",
        caption=f"not shown at {width} columns: {', '.join(hidden)} (wider terminal or --json)"
        if hidden else None,
        caption_justify="left",
    )  # fmt: skip
    for i in keep:
        col = columns[i]
        table.add_column(
            headers[i], justify=col.justify, no_wrap=not col.wrap,
            overflow="fold" if col.wrap else "ellipsis",
        )  # fmt: skip
    for row in rows:
        table.add_row(*(row[i] for i in keep))
    return table
