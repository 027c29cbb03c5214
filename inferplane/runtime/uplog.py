"""up.log for a detached `inferplane up`: its output rotated by size while it runs.

`spawn_detached` points the detached process's stdout and stderr at a pipe read by this
writer (`python -m inferplane.runtime.uplog PATH MAX_BYTES BACKUPS`), a process of its own
session: it appends what arrives, line by line, to a `RotatingLog` (`up.log`, then
`up.log.1` ... `up.log.BACKUPS`, each at most MAX_BYTES), so a fleet that runs for weeks,
or logs a flood of errors, keeps at most (BACKUPS + 1) x MAX_BYTES of it. The writer ends
at end of file: once the `up` process and everything that inherited its output have gone,
so whatever they printed last (a traceback at exit) is kept.

It ignores SIGINT, SIGTERM and SIGHUP: the `up` process could not write a line once its
reader were gone (BrokenPipeError), so only the pipe's end stops it.
"""

from __future__ import annotations

import codecs
import signal
import sys
from pathlib import Path
from typing import BinaryIO

from inferplane.runtime.process import RotatingLog

LINE_LIMIT = 1 << 16  # a longer line is written in pieces of this size


def copy(source: BinaryIO, log: RotatingLog) -> None:
    """Append `source`'s lines to `log` until end of file (UTF-8, bad bytes replaced)."""
    decode = codecs.getincrementaldecoder("utf-8")("replace").decode
    for chunk in iter(lambda: source.readline(LINE_LIMIT), b""):
        text = decode(chunk)
        if text:
            log.write(text)  # never raises: a full disk drops lines and counts them
    tail = decode(b"", final=True)
    if tail:
        log.write(tail)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m inferplane.runtime.uplog PATH MAX_BYTES BACKUPS", file=sys.stderr)
        return 2
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    log = RotatingLog(Path(argv[0]), max_bytes=int(argv[1]), backups=int(argv[2]))
    try:
        copy(sys.stdin.buffer, log)
    finally:
        log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
