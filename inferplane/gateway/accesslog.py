"""One JSON line per request with metadata only, never prompt or completion text (P44).

Lines are buffered and written in batches by a background task. A served request's line
is kept as a tuple (`served`) and formatted at the flush, so the hot path pays one append,
not a dict, rounding and `orjson.dumps`; the order of lines is the order of requests. The
flush formats a row with one bytes %-format (the same JSON, ~5x cheaper than the dict).
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


# The line `orjson.dumps` of the row's dict gave, as one %-format: strings JSON-escaped by
# orjson, times with 6 decimals (`%.6f`: the value `round(x, 6)` gave, trailing zeros kept).
_SERVED = (
    b'{"request_id":%b,"received_at":%.6f,"model":%b,"replica":%b,"replica_url":%b,'
    b'"status":%d,"prompt_tokens":%d,"completion_tokens":%d,"admission_s":%.6f,'
    b'"queue_wait_s":%.6f,"upstream_ttft_s":%.6f,"total_s":%.6f,"retries":%d}\n'
)
# Distinct (model, replica, url) triples kept escaped; replicas come and go, so bounded.
_NAMES_KEPT = 1024


def _served_lines(
    rows: list[bytes | ServedRow], names: dict[tuple[str, str, str], tuple[bytes, bytes, bytes]]
) -> bytes:
    """The buffer as log lines; `names` caches the escaped model/replica/url part."""
    dumps = orjson.dumps
    out: list[bytes] = []
    for row in rows:
        if isinstance(row, bytes):
            out.append(row)
            continue
        rid, received, model, replica, url, status, p, c, adm, queue, ttft, total, retries = row
        key = (model, replica, url)
        esc = names.get(key)
        if esc is None:
            if len(names) >= _NAMES_KEPT:
                names.clear()
            esc = names[key] = (dumps(model), dumps(replica), dumps(url))
        out.append(_SERVED % (
            dumps(rid.decode("latin-1")), received, *esc, status, p, c, adm, queue, ttft,
            total, retries,
        ))  # fmt: skip
    return b"".join(out)


class AccessLog:
    def __init__(self, path: str | None = None, flush_interval_s: float = 0.02) -> None:
        self._path = path
        self._file: IO[bytes] | None = None
        self._buffer: list[bytes | ServedRow] = []
        self._interval = flush_interval_s
        self._task: asyncio.Task[None] | None = None
        self._names: dict[tuple[str, str, str], tuple[bytes, bytes, bytes]] = {}

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
        data = _served_lines(rows, self._names)
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
