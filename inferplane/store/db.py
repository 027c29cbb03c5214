"""Opening a database by URL and migrating it to the newest schema (Alembic)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import event
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from inferplane.errors import InferplaneError

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///.inferplane/inferplane.db"
DATABASE_URL_ENV = "INFERPLANE_DATABASE_URL"
MIGRATIONS = Path(__file__).parent / "migrations"


def normalize_url(url: str) -> str:
    """Accept plain `sqlite:///` and `postgresql://` URLs; use the async drivers for them."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise InferplaneError(
            "not a database URL",
            field="database_url",
            value=url,
            fix="use sqlite:///path/to.db or postgresql://user@host:5432/db",
        ) from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return str(parsed.set(drivername="sqlite+aiosqlite").render_as_string(False))
    if backend == "postgresql":
        return str(parsed.set(drivername="postgresql+asyncpg").render_as_string(False))
    raise InferplaneError(
        "unsupported database",
        field="database_url",
        value=url,
        fix="use SQLite (sqlite:///...) or PostgreSQL (postgresql://...)",
    )


def database_url(explicit: str | None = None, fleet_url: str | None = None) -> str:
    """--db, then $INFERPLANE_DATABASE_URL, then the fleet's gateway.database_url, then
    SQLite in the state directory (.inferplane/inferplane.db)."""
    return normalize_url(
        explicit or os.environ.get(DATABASE_URL_ENV) or fleet_url or DEFAULT_DATABASE_URL
    )


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cursor = dbapi_conn.cursor()
    # WAL + synchronous=NORMAL: a committed batch survives the process being killed (-9).
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _upgrade(connection: Connection, config: Config) -> None:
    config.attributes["connection"] = connection
    command.upgrade(config, "head")


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def _private_sqlite_file(path: Path) -> None:
    """Create the database file 0600 before SQLite does (its -wal and -shm files take the
    database's mode): it holds key hashes and usage (docs/tenancy.md)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        os.chmod(path, 0o600)
    except OSError:
        pass  # read-only or another owner's file: SQLite reports what matters


class Store:
    """An async engine and session factory for one database URL."""

    def __init__(self, url: str, **engine_kw: Any) -> None:
        self.url = normalize_url(url)
        parsed = make_url(self.url)
        self.is_sqlite = parsed.get_backend_name() == "sqlite"
        if self.is_sqlite and parsed.database and parsed.database != ":memory:":
            _private_sqlite_file(Path(parsed.database))
        self.engine: AsyncEngine = create_async_engine(self.url, **engine_kw)
        if self.is_sqlite:
            event.listen(self.engine.sync_engine, "connect", _sqlite_pragmas)
        self.sessions = async_sessionmaker(self.engine, expire_on_commit=False)

    @classmethod
    async def open(cls, url: str, migrate: bool = True) -> Store:
        store = cls(url)
        if migrate:
            await store.migrate()
        return store

    def session(self) -> AsyncSession:
        return self.sessions()

    async def migrate(self) -> None:
        """Bring the schema to the newest Alembic revision (idempotent)."""
        try:
            async with self.engine.begin() as conn:
                await conn.run_sync(_upgrade, alembic_config())
        except OSError as exc:
            raise InferplaneError(
                "cannot reach the database",
                field="database_url",
                value=make_url(self.url).render_as_string(hide_password=True),
                fix=f"start it or fix the URL ({exc})",
            ) from None

    async def close(self) -> None:
        await self.engine.dispose()
