"""The usage ledger: batched writes, reports, a database outage that blocks nothing, and
a gateway killed with -9 losing at most the rows since its last flush."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from tenancy_fixtures import db_url, store  # noqa: F401

from inferplane.store import Store, UsageRow
from inferplane.tenancy.ledger import (
    SQLITE_SLICE_ROWS,
    Usage,
    UsageLedger,
    tokens_since,
    usage_report,
)

DAY = 86400.0
T0 = 1_800_000_000.0


def usage(i: int, key: str | None = "k1", model: str = "m", ts: float = T0) -> Usage:
    return Usage(
        ts=ts, request_id=f"r{i}", key_id=key, model=model, replica="http://x", prompt_tokens=i,
        completion_tokens=2 * i, status=200 if i % 10 else 429, stream=bool(i % 2),
        duration_s=0.1, ttft_s=0.01, queue_wait_s=0.0,
    )  # fmt: skip


async def count(store: Store) -> int:  # noqa: F811
    async with store.session() as s:
        return int((await s.execute(select(func.count()).select_from(UsageRow))).scalar_one())


async def test_flush_writes_everything_and_reports_group(store: Store) -> None:  # noqa: F811
    ledger = UsageLedger(store, batch_size=7)
    for i in range(1, 101):
        ledger.add(usage(i, key="k1" if i <= 60 else "k2", model="a" if i % 2 else "b",
                         ts=T0 + (DAY if i > 80 else 0)))  # fmt: skip
    assert await ledger.flush() == 100 and ledger.pending == 0
    assert await count(store) == 100
    by_key = {r["key"]: r for r in await usage_report(store, "key")}
    assert by_key["k1"]["prompt_tokens"] == sum(range(1, 61))
    assert by_key["k2"]["completion_tokens"] == 2 * sum(range(61, 101))
    assert by_key["k1"]["requests"] == 60 and by_key["k1"]["errors"] == 6
    days = await usage_report(store, "day")
    assert [d["day"] for d in days] == ["2027-01-15", "2027-01-16"]
    assert [d["requests"] for d in days] == [80, 20]
    by_model = {r["model"]: r["requests"] for r in await usage_report(store, "model")}
    assert by_model == {"a": 50, "b": 50}
    since = await usage_report(store, "key", since=T0 + 1)
    assert sum(r["requests"] for r in since) == 20
    assert (await tokens_since(store, T0 + 1)) == {"k2": 3 * sum(range(81, 101))}


async def test_background_flush_writes_in_slices_exactly(
    store: Store,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The background flush on SQLite writes a large buffer in slices (pausing between
    them) within one transaction, and every row exactly once; PostgreSQL in one go."""
    calls: list[int] = []
    real_insert = UsageLedger._insert

    async def counted(self: UsageLedger, conn: Any, rows: list[Any]) -> None:
        calls.append(len(rows))
        await real_insert(self, conn, rows)

    monkeypatch.setattr(UsageLedger, "_insert", counted)
    ledger = UsageLedger(store, flush_interval_s=0.05)
    total = 3 * SQLITE_SLICE_ROWS + 17
    for i in range(1, total + 1):
        ledger.add(usage(i))
    ledger.start()
    for _ in range(400):
        if ledger.written == total:
            break
        await asyncio.sleep(0.01)
    await ledger.stop()
    assert ledger.written == total and ledger.flushes == 1 and ledger.pending == 0
    assert await count(store) == total
    assert sum(calls) == total
    if store.is_sqlite:
        assert len(calls) == 4 and all(n % 64 == 0 for n in calls[:-1])
    else:
        assert calls == [total]
    by_key = {r["key"]: r for r in await usage_report(store, "key")}
    assert by_key["k1"]["prompt_tokens"] == sum(range(1, total + 1))


async def test_a_refused_row_in_a_later_slice_rolls_back_the_earlier_ones(
    store: Store,  # noqa: F811
) -> None:
    """A refusal in the paced flush's last slice undoes the slices before it (one
    transaction), so the split-and-retry writes every good row exactly once."""
    ledger = UsageLedger(store, flush_interval_s=0.05)
    total = 3 * SQLITE_SLICE_ROWS
    for i in range(1, total + 1):
        ledger.add(usage(i))
    ledger.add(usage(0)._replace(request_id=None))  # type: ignore[arg-type]  # NOT NULL
    ledger.start()
    for _ in range(400):
        if ledger.written == total and ledger.rejected == 1:
            break
        await asyncio.sleep(0.01)
    await ledger.stop()
    assert (ledger.written, ledger.rejected, ledger.pending) == (total, 1, 0)
    assert await count(store) == total
    async with store.session() as s:
        ids = (await s.execute(select(func.count(func.distinct(UsageRow.request_id))))).scalar()
    assert ids == total


async def test_database_outage_buffers_retries_and_counts_drops(
    store: Store,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ledger = UsageLedger(store, max_buffer=50)
    real_engine = store.engine

    class Down:
        def begin(self) -> Any:
            raise ConnectionRefusedError("database is down")

    monkeypatch.setattr(store, "engine", Down())
    for i in range(1, 41):
        ledger.add(usage(i))  # never blocks, never raises
    with pytest.raises(ConnectionRefusedError):
        await ledger.flush()
    assert ledger.pending == 40 and ledger.dropped == 0
    for i in range(41, 61):
        ledger.add(usage(i))
    with pytest.raises(ConnectionRefusedError):
        await ledger.flush()  # the buffer's bound is enforced at each flush attempt
    assert ledger.pending == 50 and ledger.dropped == 10  # the oldest 10 went
    monkeypatch.setattr(store, "engine", real_engine)
    assert await ledger.flush() == 50
    assert await count(store) == 50
    async with store.session() as s:
        first = (await s.execute(select(func.min(UsageRow.prompt_tokens)))).scalar_one()
    assert first == 11


CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from inferplane.store import Store
    from inferplane.tenancy.ledger import Usage, UsageLedger

    async def main() -> None:
        store = await Store.open(sys.argv[1])
        ledger = UsageLedger(store, flush_interval_s=float(sys.argv[2]))
        ledger.start()
        i = 0
        flushes = 0
        while True:
            i += 1
            ledger.add(Usage(0.0, f"r{i}", "k", "m", "-", i, 1, 200, False, 0, 0, 0))
            if ledger.flushes != flushes:
                flushes = ledger.flushes
                print("flushed", ledger.written, flush=True)
            print("added", i, flush=True)
            await asyncio.sleep(0.001)

    asyncio.run(main())
    """
)


async def test_kill_9_loses_at_most_one_flush_interval(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    (await Store.open(url)).engine.sync_engine.dispose()
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, url, "0.2"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert proc.stdout is not None
    flushed_seen = 0
    added = 0
    flushes_seen = 0
    for line in proc.stdout:
        kind, n = line.split()
        if kind == "flushed":
            flushed_seen = int(n)
            flushes_seen += 1
        else:
            added = int(n)
        if flushes_seen >= 3 and kind == "added" and added > flushed_seen + 20:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    store = await Store.open(url)  # noqa: F811
    async with store.session() as s:
        rows = [r for (r,) in await s.execute(select(UsageRow.prompt_tokens))]
    await store.close()
    # Every row of every completed flush is there, as a gap-free prefix of what was added;
    # only rows added after the last flush (one interval's worth) are lost.
    assert sorted(rows) == list(range(1, len(rows) + 1))
    assert len(rows) >= flushed_seen
    lost = added - len(rows)
    print(f"kill -9: {len(rows)} rows durable, {lost} lost (added since the last flush)")
    assert 0 <= lost <= added - flushed_seen


async def test_a_refused_row_never_stops_the_ledger(store: Store) -> None:  # noqa: F811
    """Issue 30 item 1: a NUL or an over-long name made PostgreSQL refuse every later
    flush (rows buffered forever, lost at `down`). The refused rows are written cleaned."""
    ledger = UsageLedger(store)
    for i in range(1, 21):
        ledger.add(usage(i))
    ledger.add(usage(21, model="nul\u0000"))
    ledger.add(usage(22, model="x" * 4000))
    ledger.add(usage(23)._replace(request_id="r\u0000" * 100))
    assert await ledger.flush() == 23
    assert ledger.pending == 0 and ledger.rejected == 0
    for i in range(24, 31):  # and the ledger goes on
        ledger.add(usage(i))
    assert await ledger.flush() == 7
    assert await count(store) == 30
    by_model = {r["model"]: r["requests"] for r in await usage_report(store, "model")}
    if store.is_sqlite:  # SQLite stores them as they are (the gateway bounds names first)
        assert by_model == {"m": 28, "nul\u0000": 1, "x" * 4000: 1}
    else:
        assert by_model == {"m": 28, "nul": 1, "x" * 200: 1}
    assert (await tokens_since(store, 0))["k1"] == 3 * sum(range(1, 31))


async def test_a_row_refused_even_cleaned_is_dropped_and_counted(
    store: Store,  # noqa: F811
) -> None:
    ledger = UsageLedger(store)
    for i in range(1, 9):
        ledger.add(usage(i))
    ledger.add(usage(9)._replace(prompt_tokens=2**40))  # beyond INTEGER: refused either way
    ledger.add(usage(10))
    if store.is_sqlite:  # SQLite stores any integer: nothing to refuse
        assert await ledger.flush() == 10
        return
    assert await ledger.flush() == 9
    assert ledger.rejected == 1 and ledger.pending == 0
    assert await count(store) == 9


async def test_rows_a_down_database_refuses_at_stop_survive_to_the_next_start(
    store: Store,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    spill = tmp_path / "state" / "usage-spill.jsonl"
    ledger = UsageLedger(store, spill_path=spill)
    real_engine = store.engine

    class Down:
        def begin(self) -> Any:
            raise ConnectionRefusedError("database is down")

        def connect(self) -> Any:
            raise ConnectionRefusedError("database is down")

    monkeypatch.setattr(store, "engine", Down())
    for i in range(1, 13):
        ledger.add(usage(i))
    await ledger.stop()
    assert spill.exists() and oct(spill.stat().st_mode & 0o777) == "0o600"
    monkeypatch.setattr(store, "engine", real_engine)
    again = UsageLedger(store, spill_path=spill, flush_interval_s=60)
    again.add(usage(13))
    again.start()
    assert again.pending == 13
    await again.stop()
    assert await count(store) == 13 and not spill.exists()
    assert (await tokens_since(store, 0))["k1"] == 3 * sum(range(1, 14))


async def test_usage_reports_by_key_model_and_day_agree_with_usage_report(
    store: Store,  # noqa: F811
) -> None:
    """Issue 28 item 5: the console's three tables came from three queries and differed
    while rows were written; one query gives the same rows as each `usage_report`."""
    from inferplane.tenancy.ledger import usage_reports

    ledger = UsageLedger(store)
    for i in range(1, 61):
        ledger.add(usage(i, key=None if i % 7 == 0 else f"k{i % 3}", model="ab"[i % 2],
                         ts=T0 + DAY * (i % 4)))  # fmt: skip
    await ledger.flush()
    for since in (None, T0 + DAY):
        together = await usage_reports(store, since)
        for by in ("key", "model", "day"):
            assert together[by] == await usage_report(store, by, since), by
        totals = {by: sum(r["total_tokens"] for r in rows) for by, rows in together.items()}
        assert len(set(totals.values())) == 1
