"""The store: SQLAlchemy 2 (async) tables for API keys, teams, route rules and the usage
ledger. SQLite (aiosqlite) in the state directory by default, PostgreSQL (asyncpg) by URL.
Knows nothing of HTTP; the gateway reads it off the hot path (caches, batched writes)."""

from inferplane.store.db import DEFAULT_DATABASE_URL, Store, database_url, normalize_url
from inferplane.store.models import ApiKey, Base, RouteRule, Team, UsageRow

__all__ = [
    "DEFAULT_DATABASE_URL",
    "ApiKey",
    "Base",
    "RouteRule",
    "Store",
    "Team",
    "UsageRow",
    "database_url",
    "normalize_url",
]
