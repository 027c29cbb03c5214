"""The Alembic migrations create exactly the tables the models describe, on SQLite and on a
real PostgreSQL, and running them twice is harmless."""

from __future__ import annotations

from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, select
from sqlalchemy.engine import Connection
from tenancy_fixtures import db_url, store  # noqa: F401

from inferplane.store import ApiKey, Base, Store, UsageRow


def _diff(connection: Connection) -> list[Any]:
    context = MigrationContext.configure(connection)
    return list(compare_metadata(context, Base.metadata))


def _tables(connection: Connection) -> set[str]:
    return set(inspect(connection).get_table_names())


async def test_migrated_schema_matches_the_models(store: Store) -> None:  # noqa: F811
    async with store.engine.connect() as conn:
        assert await conn.run_sync(_diff) == []
        assert {"teams", "api_keys", "route_rules", "usage", "alembic_version"} <= (
            await conn.run_sync(_tables)
        )


async def test_migrate_is_idempotent_and_tables_work(store: Store) -> None:  # noqa: F811
    await store.migrate()
    async with store.session() as session:
        session.add(
            ApiKey(
                id="k1", name="n", prefix="ip-x", secret_hash="h" * 64, created_at=1.0,
                allowed_models=["a", "b"], budget_period="day", priority="batch",
            )
        )
        session.add(
            UsageRow(
                ts=1.0, request_id="r", key_id="k1", model="m", replica="-", prompt_tokens=1,
                completion_tokens=2, status=200, stream=False, duration_s=0.1, ttft_s=0.0,
                queue_wait_s=0.0,
            )
        )
        await session.commit()
    async with store.session() as session:
        key = (await session.execute(select(ApiKey))).scalar_one()
        assert key.allowed_models == ["a", "b"]
        row = (await session.execute(select(UsageRow))).scalar_one()
        assert row.id >= 1 and row.completion_tokens == 2
