"""One JSON line per request with metadata only, never prompt or completion text (P44).

Lines are buffered and written in batches by a background task so logging costs one
`orjson.dumps` per request on the hot path, not a handler chain and a syscall.
"""

from __future__ import annotations

import asyncio
import sys
from typing import IO, Any

import orjson

from inferplane.aio import cancel_and_wait


class AccessLog:
    def __init__(self, path: str | None = None, flush_interval_s: float = 0.2) -> None:
        self._path = path
        self._file: IO[bytes] | None = None
        self._buffer: list[bytes] = []
        self._interval = flush_interval_s
        self._task: asyncio.Task[None] | None = None

    def write(self, record: dict[str, Any]) -> None:
        self._buffer.append(orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE))
        if len(self._buffer) >= 4096:
            self.flush()  # bound memory if the flusher is not running

    def flush(self) -> None:
        if not self._buffer:
            return
        if self._file is None:
            self._file = open(self._path, "ab") if self._path else sys.stderr.buffer  # noqa: SIM115
        data, self._buffer = b"".join(self._buffer), []
        try:
            self._file.write(data)
            self._file.flush()
        except (OSError, ValueError):
            pass  # a closed or full log must not take the gateway down

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            self.flush()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        self.flush()
        if self._path and self._file is not None:
            self._file.close()
            self._file = None
