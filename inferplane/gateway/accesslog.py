"""One JSON line per request with metadata only, never prompt or completion text (P44).

Lines are buffered and written in batches by a background task. A served request's line
is kept as a tuple (`served`) and formatted at the flush, so the hot path pays one append,
not a dict, rounding and `orjson.dumps`; the order of lines is the order of requests.
"""

from __future__ import annotations

import asyncio
import sys
from typing import IO, Any

import orjson

from inferplane.aio import cancel_and_wait

# A served request's row, in line order (`AccessLog.served`).
SERVED_KEYS = (
    "request_id", "received_at", "model", "replica", "replica_url", "status", "prompt_tokens",
    "completion_tokens", "admission_s", "queue_wait_s", "upstream_ttft_s", "total_s", "retries",
)  # fmt: skip
ServedRow = tuple[bytes, float, str, str, str, int, int, int, float, float, float, float, int]
_NL = orjson.OPT_APPEND_NEWLINE


def _served_line(row: ServedRow) -> bytes:
    rid, received, model, replica, url, status, p, c, adm, queue, ttft, total, retries = row
    return orjson.dumps({
        "request_id": rid.decode("latin-1"),
        # when it arrived, so `inferplane trace` can put the phases on a clock
        "received_at": round(received, 6), "model": model, "replica": replica,
        "replica_url": url,  # for operators (`inferplane trace`); never in /metrics
        "status": status, "prompt_tokens": p, "completion_tokens": c,
        "admission_s": round(adm, 6), "queue_wait_s": round(queue, 6),
        "upstream_ttft_s": round(ttft, 6), "total_s": round(total, 6), "retries": retries,
    }, option=_NL)  # fmt: skip


class AccessLog:
    def __init__(self, path: str | None = None, flush_interval_s: float = 0.2) -> None:
        self._path = path
        self._file: IO[bytes] | None = None
        self._buffer: list[bytes | ServedRow] = []
        self._interval = flush_interval_s
        self._task: asyncio.Task[None] | None = None

    def write(self, record: dict[str, Any]) -> None:
        self._buffer.append(orjson.dumps(record, option=_NL))
        if len(self._buffer) >= 4096:
            self.flush()  # bound memory if the flusher is not running

    def served(self, row: ServedRow) -> None:
        """A served request's line (fields as `SERVED_KEYS`), formatted at the flush."""
        self._buffer.append(row)
        if len(self._buffer) >= 4096:
            self.flush()

    def flush(self) -> None:
        if not self._buffer:
            return
        if self._file is None:
            self._file = open(self._path, "ab") if self._path else sys.stderr.buffer  # noqa: SIM115
        rows, self._buffer = self._buffer, []
        data = b"".join(r if isinstance(r, bytes) else _served_line(r) for r in rows)
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
