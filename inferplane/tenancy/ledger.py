"""The usage ledger: one row per request, written off the hot path in batches.

`add` is synchronous and O(1); a background task inserts the buffer every
`flush_interval_s` in one transaction (on SQLite in paced slices, see SQLITE_SLICE_ROWS).
Durability: a gateway killed with -9 loses at most the rows added since the start of the
last completed flush (one flush interval plus the running flush's own time, its pacing
bounded at PACE_SHARE of the interval). A database outage never
blocks or fails requests: rows stay buffered and the flush is retried with backoff; when the
buffer reaches `max_buffer` rows the oldest are dropped and counted (`dropped`, exported as
`inferplane_usage_dropped_total`).

A row the database refuses (a NUL byte or an over-long string PostgreSQL will not store)
never stops the ledger: a failed batch is split in halves until the refused row stands
alone; that row is written once more with its strings cleaned (NULs removed, cut to the
column's length), so its tokens still count, and only a row refused even then is dropped
(`rejected`, exported as `inferplane_usage_rejected_total`). A database still down at
`stop` (the gateway's shutdown) gets the buffer spilled to `spill_path`; the next start
loads it back, so `down` during an outage loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
from collections import deque
from itertools import chain
from pathlib import Path
from typing import Any, Final, NamedTuple

import orjson
from sqlalchemy import Integer, case, cast, func, insert, select, text

from inferplane.aio import cancel_and_wait
from inferplane.errors import InferplaneError
from inferplane.store import ApiKey, Store, UsageRow

log = logging.getLogger("inferplane.usage")


class Usage(NamedTuple):
    """One ledger row, in column order: a tuple, so a batch goes to the driver as it is."""

    ts: float
    request_id: str
    key_id: str | None
    model: str
    replica: str
    prompt_tokens: int
    completion_tokens: int
    status: int
    stream: bool
    duration_s: float
    ttft_s: float
    queue_wait_s: float


# The same row as a plain tuple, what the gateway builds per request (no constructor call).
LedgerRow = tuple[float, str, str | None, str, str, int, int, int, bool, float, float, float]
# Positions in a LedgerRow (Final: mypy then knows each element's type).
TS: Final = 0
PROMPT_TOKENS: Final = 5
COMPLETION_TOKENS: Final = 6

_COLUMNS = Usage._fields
# Positional placeholders per DBAPI paramstyle, for the raw executemany fast path.
_PLACEHOLDERS = {
    "qmark": lambda i: "?",
    "numeric_dollar": lambda i: f"${i}",
    "format": lambda i: "%s",
}
# SQLite: rows per INSERT statement. One multi-row VALUES statement per 64 rows costs a
# third less CPU per row than one statement per row (768 parameters, under SQLite's
# oldest limit of 999). asyncpg pipelines executemany on its own, so PostgreSQL keeps 1.
SQLITE_ROWS_PER_STATEMENT = 64
# SQLite's CPU is the gateway's own: its thread shares the process's cores (one under the
# benchmark's taskset). The background flush writes in slices of at least this many rows
# (~1.2 ms of SQLite each) with a short pause between them, so the event loop is never
# held off for a whole flush (10-15 ms at 4,000 rows) in one burst. At most MAX_SLICES a
# flush (each is a thread hop) and the pauses within PACE_SHARE of the flush interval:
# a flush is never paced past that, so the ledger keeps up as the unpaced one does.
SQLITE_SLICE_ROWS = 512
MAX_SLICES = 8
MAX_SLICE_PAUSE_S = 0.005
PACE_SHARE = 0.25


@functools.lru_cache(maxsize=16)  # per engine dialect; built once, not on every flush
def _insert_sql(dialect: Any, rows_per_statement: int = 1) -> str | None:
    """INSERT of `rows_per_statement` rows in the driver's own paramstyle, or None (unknown
    paramstyle: use SQLAlchemy's insert). Executing it with tuples skips SQLAlchemy's
    per-row parameter processing, which was most of the ledger's CPU on the gateway."""
    placeholder = _PLACEHOLDERS.get(dialect.paramstyle)
    if placeholder is None:
        return None
    quote = dialect.identifier_preparer.quote
    cols = ", ".join(quote(c) for c in _COLUMNS)
    width = len(_COLUMNS)
    values = ", ".join(
        "(" + ", ".join(placeholder(r * width + i) for i in range(1, width + 1)) + ")"
        for r in range(rows_per_statement)
    )
    return f"INSERT INTO {quote(UsageRow.__tablename__)} ({cols}) VALUES {values}"


# Column lengths of the string fields (UsageRow): a cleaned row fits them.
_STRING_LIMITS = {
    i: getattr(UsageRow, name).type.length
    for i, name in enumerate(_COLUMNS)
    if getattr(getattr(UsageRow, name).type, "length", None)
}


def clean_row(row: LedgerRow) -> LedgerRow:
    """The row with every string a database accepts: NULs removed, cut to its column."""
    out = list(row)
    for i, limit in _STRING_LIMITS.items():
        value = out[i]
        if isinstance(value, str):
            out[i] = value.replace("\x00", "")[:limit]
    return tuple(out)  # type: ignore[return-value]


def _grouped(rows: list[LedgerRow], per: int) -> tuple[list[tuple[Any, ...]], list[LedgerRow]]:
    """Flattened parameter tuples of `per` rows each, and the rows left over."""
    whole = len(rows) - len(rows) % per
    groups = [tuple(chain.from_iterable(rows[i : i + per])) for i in range(0, whole, per)]
    return groups, rows[whole:]


class UsageLedger:
    def __init__(
        self,
        store: Store,
        flush_interval_s: float = 0.25,
        max_buffer: int = 200_000,
        batch_size: int = 5_000,
        max_backoff_s: float = 30.0,
        write_timeout_s: float = 10.0,
        spill_path: Path | None = None,
    ) -> None:
        self.store = store
        self.flush_interval_s = flush_interval_s
        self.max_buffer = max_buffer
        self.batch_size = batch_size
        self.max_backoff_s = max_backoff_s
        self.write_timeout_s = write_timeout_s
        self._buf: deque[LedgerRow] = deque()
        self._task: asyncio.Task[None] | None = None
        # One flush at a time: an explicit flush (stop, tests) waits for the background one
        # in flight, so "flush returned" means every row added before it is written.
        self._flushing = asyncio.Lock()
        self.written = 0
        self.dropped = 0
        self.failures = 0
        self.flushes = 0
        self.rejected = 0  # rows the database refused even cleaned (logged, dropped)
        self.spill_path = spill_path  # where `stop` leaves rows a down database refused
        self._spill_loaded = False

    @property
    def pending(self) -> int:
        return len(self._buf)

    def add(self, row: LedgerRow) -> None:
        """Queue a row. Just an append: `max_buffer` is enforced at each flush attempt, so
        during an outage the buffer may hold one flush interval's rows more."""
        self._buf.append(row)

    def _trim(self) -> None:
        """Drop the oldest rows beyond `max_buffer`, counted in `dropped`."""
        buf = self._buf
        for _ in range(len(buf) - self.max_buffer):
            buf.popleft()
            self.dropped += 1

    def start(self) -> None:
        if self._task is None:
            self.load_spill()
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop the background task and write what is buffered (one last try); what a
        down database refused goes to `spill_path`."""
        await cancel_and_wait(self._task)
        self._task = None
        with contextlib.suppress(Exception):
            await self.flush()
        if self._buf and self.spill_path is not None:
            self._spill()

    def _spill(self) -> None:
        """Write the buffer to `spill_path` (0600, atomically; it replaces an older spill,
        whose rows were loaded into this buffer at start)."""
        path = self.spill_path
        assert path is not None
        lines = b"".join(orjson.dumps(list(r)) + b"\n" for r in self._buf)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(lines)
            os.replace(tmp, path)
        except OSError as exc:
            log.error("usage ledger: %d rows lost, cannot spill to %s: %s",
                      len(self._buf), path, exc)  # fmt: skip
            return
        log.warning("usage ledger: database unreachable at shutdown; %d rows kept in %s "
                    "(written at the next start)", len(self._buf), path)  # fmt: skip

    def load_spill(self) -> int:
        """Put rows spilled by an earlier `stop` at the buffer's front; the file goes once
        a flush has written them."""
        path = self.spill_path
        if path is None or self._spill_loaded or not path.exists():
            return 0
        rows: list[LedgerRow] = []
        try:
            for line in path.read_bytes().splitlines():
                with contextlib.suppress(orjson.JSONDecodeError, TypeError, ValueError):
                    item = orjson.loads(line)
                    if isinstance(item, list) and len(item) == len(_COLUMNS):
                        rows.append(tuple(item))
        except OSError as exc:
            log.warning("usage ledger: cannot read spilled rows in %s: %s", path, exc)
            return 0
        self._buf.extendleft(reversed(rows))
        self._spill_loaded = True
        return len(rows)

    async def _run(self) -> None:
        """Flush every `flush_interval_s`, counted from each flush's start (a paced flush
        does not stretch the interval); back off while the database is down."""
        loop = asyncio.get_running_loop()
        delay = self.flush_interval_s
        due = loop.time() + delay
        while True:
            await asyncio.sleep(max(0.0, due - loop.time()))
            started = loop.time()
            try:
                async with self._flushing:
                    await self._flush(paced=True)
                delay = self.flush_interval_s
                due = started + delay
            except Exception as exc:  # the database is down: keep the rows, back off
                self.failures += 1
                delay = min(max(delay, self.flush_interval_s) * 2, self.max_backoff_s)
                due = loop.time() + delay
                log.warning("usage ledger flush failed (%s); %d rows buffered", exc, self.pending)

    async def flush(self) -> int:
        """Insert everything buffered; on failure the rows go back to the buffer's front."""
        async with self._flushing:
            return await self._flush()

    async def _flush(self, paced: bool = False) -> int:
        self._trim()
        if not self._buf:
            return 0
        batch, self._buf = self._buf, deque()
        rows = list(batch)
        try:
            await self._write(rows, paced)
        except asyncio.CancelledError:
            self._requeue(batch)
            raise
        except Exception:
            if not await self._reachable():
                self._requeue(batch)
                raise
            try:  # the database is up and refused the batch: find the rows it refuses
                left = await self._isolate(rows)
            except BaseException:
                self._requeue(batch)
                raise
            written = len(rows) - left
        else:
            written = len(rows)
        self.written += written
        self.flushes += 1
        self._forget_spill()
        return written

    async def _write(self, rows: list[LedgerRow], paced: bool = False) -> None:
        """All `rows` in one transaction; `paced` (the background flush, SQLite only): in
        slices with a pause between them while within the pacing budget."""
        step, pause, deadline = self.batch_size, 0.0, 0.0
        loop = asyncio.get_running_loop()
        if paced and self.store.is_sqlite and len(rows) > SQLITE_SLICE_ROWS:
            slices = min(MAX_SLICES, -(-len(rows) // SQLITE_SLICE_ROWS))
            per = SQLITE_ROWS_PER_STATEMENT  # whole multi-row statements per slice
            step = -(-len(rows) // slices // per) * per
            budget = self.flush_interval_s * PACE_SHARE
            pause = min(MAX_SLICE_PAUSE_S, budget / slices)
            deadline = loop.time() + budget
        async with asyncio.timeout(self.write_timeout_s), self.store.engine.begin() as conn:
            for i in range(0, len(rows), step):
                if i and pause and loop.time() + pause < deadline:
                    await asyncio.sleep(pause)
                await self._insert(conn, rows[i : i + step])

    async def _reachable(self) -> bool:
        try:
            async with asyncio.timeout(self.write_timeout_s), self.store.engine.connect() as c:
                await c.execute(text("SELECT 1"))
        except Exception:
            return False
        return True

    async def _isolate(self, rows: list[LedgerRow]) -> int:
        """Write `rows` in halves until each refused row stands alone; such a row is
        written cleaned, or dropped and counted. Returns the rows not written. Raises
        (the caller requeues everything) when the database goes away meanwhile; rows
        already written then come back as duplicates, which is rarer than losing them."""
        try:
            await self._write(rows)
            return 0
        except Exception as exc:
            if len(rows) > 1:
                half = len(rows) // 2
                return await self._isolate(rows[:half]) + await self._isolate(rows[half:])
            refusal = exc
        if not await self._reachable():
            raise refusal
        try:
            await self._write([clean_row(rows[0])])
            log.warning("usage ledger: a row the database refused was written cleaned "
                        "(%s)", str(refusal).splitlines()[0][:200])  # fmt: skip
            return 0
        except Exception as exc:
            self.rejected += 1
            log.error("usage ledger: dropped a row the database refuses (%s): %r",
                      str(exc).splitlines()[0][:200], clean_row(rows[0]))  # fmt: skip
            return 1

    def _forget_spill(self) -> None:
        if self._spill_loaded and self.spill_path is not None:
            self.spill_path.unlink(missing_ok=True)
            self._spill_loaded = False

    async def _insert(self, conn: Any, rows: list[LedgerRow]) -> None:
        sql = _insert_sql(conn.dialect)
        if sql is None:
            await conn.execute(
                insert(UsageRow), [dict(zip(_COLUMNS, r, strict=True)) for r in rows]
            )
            return
        if self.store.is_sqlite:
            await self._insert_sqlite(conn, sql, rows)
            return
        await conn.exec_driver_sql(sql, rows)

    async def _insert_sqlite(self, conn: Any, sql: str, rows: list[LedgerRow]) -> None:
        """Straight to aiosqlite, inside SQLAlchemy's transaction (the same connection):
        one thread hop per statement, where SQLAlchemy's cursor adapter makes several
        and its per-call work on the event loop was most of a slice's loop-side cost."""
        driver = (await conn.get_raw_connection()).driver_connection
        if len(rows) >= SQLITE_ROWS_PER_STATEMENT:
            groups, rows = _grouped(rows, SQLITE_ROWS_PER_STATEMENT)
            await driver.executemany(_insert_sql(conn.dialect, SQLITE_ROWS_PER_STATEMENT), groups)
        if rows:
            await driver.executemany(sql, rows)

    def _requeue(self, batch: deque[LedgerRow]) -> None:
        batch.extend(self._buf)  # rows added while the write was in flight go after
        self._buf = batch
        self._trim()


GROUPS = ("key", "model", "day")


def _day(store: Store) -> Any:
    if store.is_sqlite:
        return func.strftime("%Y-%m-%d", UsageRow.ts, "unixepoch")
    return func.to_char(func.timezone("UTC", func.to_timestamp(UsageRow.ts)), "YYYY-MM-DD")


async def usage_report(
    store: Store, by: str = "key", since: float | None = None
) -> list[dict[str, Any]]:
    """Requests and tokens grouped by key, model or UTC day, largest first for key/model."""
    if by not in GROUPS:
        raise InferplaneError(
            "unknown grouping", field="--by", value=by, fix=f"use one of {', '.join(GROUPS)}"
        )
    group: Any = {"key": UsageRow.key_id, "model": UsageRow.model, "day": _day(store)}[by]
    prompt = func.coalesce(func.sum(UsageRow.prompt_tokens), 0)
    completion = func.coalesce(func.sum(UsageRow.completion_tokens), 0)
    errors = func.sum(case((UsageRow.status >= 400, 1), else_=0))
    query = select(
        group.label("group"),
        func.count().label("requests"),
        cast(errors, Integer).label("errors"),
        cast(prompt, Integer).label("prompt_tokens"),
        cast(completion, Integer).label("completion_tokens"),
    ).group_by(group)
    if since is not None:
        query = query.where(UsageRow.ts >= since)
    async with store.session() as session:
        rows = (await session.execute(query)).all()
        names: dict[str, str] = {}
        if by == "key":
            names = dict((await session.execute(select(ApiKey.id, ApiKey.name))).all())
    out = []
    for g, requests, errs, p, c in rows:
        item: dict[str, Any] = {by: g if g is not None else "-"}
        if by == "key":
            item["name"] = names.get(g, "anonymous" if g is None else "-")
        item.update(
            requests=int(requests),
            errors=int(errs or 0),
            prompt_tokens=int(p),
            completion_tokens=int(c),
            total_tokens=int(p) + int(c),
        )
        out.append(item)
    if by == "day":
        out.sort(key=lambda r: r["day"])
    else:
        out.sort(key=lambda r: (-r["total_tokens"], str(r[by])))
    return out


async def usage_reports(
    store: Store, since: float | None = None
) -> dict[str, list[dict[str, Any]]]:
    """`usage_report` by key, by model and by day, from one query (one snapshot of the
    ledger: the three tables' totals always agree, even while rows are being written)."""
    day = _day(store)
    prompt = func.coalesce(func.sum(UsageRow.prompt_tokens), 0)
    completion = func.coalesce(func.sum(UsageRow.completion_tokens), 0)
    errors = func.sum(case((UsageRow.status >= 400, 1), else_=0))
    query = select(
        UsageRow.key_id, UsageRow.model, day.label("day"), func.count(),
        cast(errors, Integer), cast(prompt, Integer), cast(completion, Integer),
    ).group_by(UsageRow.key_id, UsageRow.model, day)  # fmt: skip
    if since is not None:
        query = query.where(UsageRow.ts >= since)
    async with store.session() as session:
        cells = (await session.execute(query)).all()
        names = dict((await session.execute(select(ApiKey.id, ApiKey.name))).all())
    out: dict[str, list[dict[str, Any]]] = {}
    for position, by in enumerate(GROUPS):
        sums: dict[Any, list[int]] = {}
        for cell in cells:
            acc = sums.setdefault(cell[position], [0, 0, 0, 0])
            for i in range(4):
                acc[i] += int(cell[3 + i] or 0)
        rows = []
        for g, (requests, errs, p, c) in sums.items():
            item: dict[str, Any] = {by: g if g is not None else "-"}
            if by == "key":
                item["name"] = names.get(g, "anonymous" if g is None else "-")
            item.update(requests=requests, errors=errs, prompt_tokens=p, completion_tokens=c,
                        total_tokens=p + c)  # fmt: skip
            rows.append(item)
        if by == "day":
            rows.sort(key=lambda r: r["day"])
        else:
            rows.sort(key=lambda r: (-r["total_tokens"], str(r[by])))
        out[by] = rows
    return out


async def tokens_since(store: Store, since: float) -> dict[str, int]:
    """Tokens used per key since `since` (seeds budget counters when a gateway starts)."""
    total = func.sum(UsageRow.prompt_tokens + UsageRow.completion_tokens)
    query = (
        select(UsageRow.key_id, total)
        .where(UsageRow.ts >= since, UsageRow.key_id.is_not(None))
        .group_by(UsageRow.key_id)
    )
    async with store.session() as session:
        return {k: int(v or 0) for k, v in (await session.execute(query)).all() if k}
