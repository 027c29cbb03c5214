"""Fixtures shared by the store and tenancy tests: one database per backend (SQLite always,
a real PostgreSQL when $INFERPLANE_TEST_POSTGRES_URL is set) and one limiter per backend
(in memory always, a real Redis when $INFERPLANE_TEST_REDIS_URL is set). CI sets both."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import text

from inferplane.store import Store
from inferplane.tenancy.leased import LeasedRedisLimiter
from inferplane.tenancy.limits import Limiter, MemoryLimiter, RedisLimiter

POSTGRES_URL = os.environ.get("INFERPLANE_TEST_POSTGRES_URL")
REDIS_URL = os.environ.get("INFERPLANE_TEST_REDIS_URL")
NO_POSTGRES = "set INFERPLANE_TEST_POSTGRES_URL to a scratch PostgreSQL database (.ci/run does)"
NO_REDIS = "set INFERPLANE_TEST_REDIS_URL to a scratch Redis server (.ci/run does)"


async def reset_postgres(url: str) -> None:
    scratch = Store(url)
    async with scratch.engine.begin() as conn:
        await conn.execute(text("DROP SCHEMA public CASCADE"))
        await conn.execute(text("CREATE SCHEMA public"))
    await scratch.close()


def db_url_for(kind: str, tmp_path: Path) -> str:
    if kind == "postgres":
        if not POSTGRES_URL:
            pytest.skip(NO_POSTGRES)
        return POSTGRES_URL
    return f"sqlite:///{tmp_path / 'inferplane.db'}"


@pytest.fixture(params=["sqlite", "postgres"])
async def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    url = db_url_for(request.param, tmp_path)
    if request.param == "postgres":
        await reset_postgres(url)
    return url


@pytest.fixture()
async def store(db_url: str) -> AsyncIterator[Store]:
    s = await Store.open(db_url)
    yield s
    await s.close()


@pytest.fixture(params=["memory", "redis", "leased"])
async def limiter(request: pytest.FixtureRequest) -> AsyncIterator[Limiter]:
    if request.param == "memory":
        yield MemoryLimiter()
        return
    if not REDIS_URL:
        pytest.skip(NO_REDIS)
    prefix = f"iptest:{os.urandom(4).hex()}:"
    lim: RedisLimiter | LeasedRedisLimiter
    if request.param == "leased":  # no background sync: the tests pass time in
        lim = LeasedRedisLimiter(REDIS_URL, prefix=prefix, background=False)
    else:
        lim = RedisLimiter(REDIS_URL, prefix=prefix)
    yield lim
    await lim.clear()
    await lim.close()
