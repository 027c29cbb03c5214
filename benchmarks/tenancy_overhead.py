"""Tenancy's cost on the gateway's hot path: `admit` + `record` per request, in-process.

Rows: no tenancy (baseline: the loop itself), auth off (anonymous, ledger row only), a key
without limits, a key with RPM+TPM+concurrency limits in memory, and the same on Redis when
--redis-url is given. Prints microseconds per request and the ratio to the cheapest row;
compare with the gateway's own per-request cost (docs/gateway.md) for the RPS impact.

    python benchmarks/tenancy_overhead.py [--requests 50000] [--redis-url redis://127.0.0.1:6379/0]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from inferplane.store import Store
from inferplane.tenancy.keys import create_key
from inferplane.tenancy.ledger import Usage
from inferplane.tenancy.limits import Limiter, MemoryLimiter, RedisLimiter
from inferplane.tenancy.service import Admission, Rejection, Tenancy


def usage(i: int) -> Usage:
    return Usage(time.time(), f"r{i}", None, "m", "-", 10, 20, 200, False, 0.1, 0.01, 0.0)


async def run_row(
    tenancy: Tenancy | None, auth: bytes | None, n: int
) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        if tenancy is None:
            usage(i)
            continue
        adm = await tenancy.admit(auth, "m", 12)
        assert not isinstance(adm, Rejection), adm
        assert isinstance(adm, Admission)
        tenancy.record(adm, usage(i), 12)
        if tenancy.ledger is not None and tenancy.ledger.pending >= 5000:
            tenancy.ledger._buf.clear()  # measure the hot path, not the database
    if tenancy is not None and tenancy._pending:
        await asyncio.gather(*tenancy._pending)
    return (time.perf_counter() - t0) / n * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args()
    n = args.requests
    with tempfile.TemporaryDirectory() as tmp:
        store = await Store.open(f"sqlite:///{Path(tmp) / 'bench.db'}")
        _, free = await create_key(store, "free")
        _, limited = await create_key(store, "limited", rpm=10**9, tpm=10**12,
                                      max_concurrent=10**6)  # fmt: skip
        rows: list[tuple[str, float]] = [("no tenancy (loop only)", await run_row(None, None, n))]

        async def with_limiter(name: str, limiter: Limiter, auth: bytes | None,
                               mode: str, count: int) -> None:  # fmt: skip
            t = Tenancy(store, limiter, auth=mode)  # type: ignore[arg-type]
            await t.refresh()
            rows.append((name, await run_row(t, auth, count)))
            await limiter.close()

        await with_limiter("auth off, ledger only", MemoryLimiter(), None, "off", n)
        await with_limiter("key, no limits", MemoryLimiter(), b"Bearer " + free.encode(), "on", n)
        await with_limiter("key + rpm/tpm/concurrency (memory)", MemoryLimiter(),
                           b"Bearer " + limited.encode(), "on", n)  # fmt: skip
        if args.redis_url:
            await with_limiter("key + rpm/tpm/concurrency (redis)", RedisLimiter(args.redis_url,
                               prefix="bench:"), b"Bearer " + limited.encode(), "on",
                               max(1000, n // 10))  # fmt: skip
        await store.close()
    print(f"{'row':<40} {'us/request':>11}")
    for name, us in rows:
        print(f"{name:<40} {us:>11.2f}")


if __name__ == "__main__":
    asyncio.run(main())
