"""Reading an instance's rotating log: the last lines, and following it like `tail -F`.

`RotatingLog` renames `NAME.log` to `NAME.log.1` when it is full and opens a new
`NAME.log`; `follow` notices the new file (another inode), reads what is left of the old
one first, then any file rotated after it (several rotations between two polls), then
continues with the new one, so no line is lost or repeated.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

BLOCK = 64 * 1024


def tail_offset(handle: BinaryIO, lines: int) -> int:
    """The offset where the last `lines` lines of the open file start (0 = all of it)."""
    end = handle.seek(0, os.SEEK_END)
    if lines <= 0:
        return end
    pos = end
    newlines = 0
    # A final newline ends the last line; it does not start another one.
    if end:
        handle.seek(end - 1)
        if handle.read(1) == b"\n":
            newlines = -1
    while pos > 0:
        step = min(BLOCK, pos)
        pos -= step
        handle.seek(pos)
        block = handle.read(step)
        for i in range(len(block) - 1, -1, -1):
            if block[i] == 0x0A:
                newlines += 1
                if newlines == lines:
                    return pos + i + 1
    return 0


def read_tail(path: Path, lines: int) -> bytes:
    """The last `lines` lines of `path` (bytes, as written)."""
    with open(path, "rb") as handle:
        handle.seek(tail_offset(handle, lines))
        return handle.read()


def _rotated_after(path: Path, inode: int) -> list[Path]:
    """The rotated files written after the file `inode` (now `path.N`), oldest first."""
    chain: list[Path] = []
    for n in range(1, 1000):
        older = path.with_name(f"{path.name}.{n}")
        try:
            if os.stat(older).st_ino == inode:
                return list(reversed(chain))
        except FileNotFoundError:
            return []
        chain.append(older)
    return []


def follow(
    path: Path,
    write: Callable[[bytes], None],
    lines: int = 10,
    stop: Callable[[], bool] = lambda: False,
    poll_s: float = 0.2,
) -> None:
    """Write the last `lines` lines of `path`, then everything appended to it, across
    rotation and truncation, until `stop()` is true (checked whenever there is nothing new)."""
    handle = open(path, "rb")  # noqa: SIM115 (reopened on rotation)
    try:
        handle.seek(tail_offset(handle, lines))
        inode = os.fstat(handle.fileno()).st_ino
        while True:
            chunk = handle.read(BLOCK)
            if chunk:
                write(chunk)
                continue
            if stop():
                return
            try:
                current = os.stat(path)
            except FileNotFoundError:  # between the rename and the new file
                time.sleep(poll_s)
                continue
            if current.st_ino != inode:
                rest = handle.read()  # what was appended before the rename
                if rest:
                    write(rest)
                handle.close()
                for newer in _rotated_after(path, inode):  # rotated more than once
                    with contextlib.suppress(FileNotFoundError), open(newer, "rb") as whole:
                        while chunk := whole.read(BLOCK):
                            write(chunk)
                handle = open(path, "rb")  # noqa: SIM115
                inode = os.fstat(handle.fileno()).st_ino
                continue
            if current.st_size < handle.tell():  # truncated in place
                handle.seek(0)
                continue
            time.sleep(poll_s)
    finally:
        handle.close()
