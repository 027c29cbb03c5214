"""Building the gateway's `Tenancy` from a fleet file and the command line.

Shared by `inferplane gateway` and `inferplane up` so both resolve the database, auth mode,
limits, admin token and seeded routes the same way (docs/tenancy.md):

- database: `--db`, then `$INFERPLANE_DATABASE_URL`, then the fleet's
  `gateway.database_url`, then `default_db` (SQLite in the state directory); `--db @PATH`
  and `$INFERPLANE_DATABASE_URL_FILE` read the URL from a file, so a password stays out of
  `ps` and shell history;
- limiter: Redis when `$INFERPLANE_REDIS_URL` or `gateway.redis_url` is set (credit leased
  per `gateway.redis_sync_s`, or `$INFERPLANE_REDIS_SYNC_S`; 0: exact, a round trip per
  request), else memory;
- auth: the fleet's `gateway.auth` (`auto` without a fleet);
- admin token: the environment variable named by `gateway.admin_token_env`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from inferplane.store import DEFAULT_DATABASE_URL, Store, database_url
from inferplane.tenancy.leased import LeasedRedisLimiter
from inferplane.tenancy.limits import Limiter, Limits, MemoryLimiter, RedisLimiter
from inferplane.tenancy.service import RateLimitHeaders, Tenancy

if TYPE_CHECKING:
    from inferplane.spec import FleetSpec

REDIS_URL_ENV = "INFERPLANE_REDIS_URL"
REDIS_SYNC_ENV = "INFERPLANE_REDIS_SYNC_S"
DATABASE_URL_FILE_ENV = "INFERPLANE_DATABASE_URL_FILE"
DEFAULT_ADMIN_TOKEN_ENV = "INFERPLANE_ADMIN_TOKEN"
USAGE_SPILL_FILE = "usage-spill.jsonl"  # ledger rows kept through a database outage at stop


def state_dir_database_url(state_dir: Path) -> str:
    """The default SQLite database of a state directory: `STATE/inferplane.db`."""
    return f"sqlite:///{state_dir.resolve() / 'inferplane.db'}"


def tenancy_database_url(
    spec: FleetSpec | None, db: str | None, default_db: str | None = None
) -> str:
    """--db, $INFERPLANE_DATABASE_URL, the fleet's gateway.database_url, then `default_db`
    (default: sqlite in ./.inferplane/)."""
    fleet_url = spec.gateway.database_url if spec is not None else None
    if db is not None and db.startswith("@"):
        db = read_secret_file(db[1:], "--db")
    elif db is None and os.environ.get(DATABASE_URL_FILE_ENV):
        db = read_secret_file(os.environ[DATABASE_URL_FILE_ENV], DATABASE_URL_FILE_ENV)
    return database_url(db, fleet_url or default_db or DEFAULT_DATABASE_URL)


def read_secret_file(path: str, field: str) -> str:
    """The first line of a file holding a secret (a database URL with its password)."""
    from inferplane.errors import InferplaneError

    try:
        value = Path(path).expanduser().read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise InferplaneError(
            f"cannot read {path}: {exc.strerror}", field=field, value=path,
            fix="give a readable file holding the database URL",
        ) from None  # fmt: skip
    if not value:
        raise InferplaneError("the file is empty", field=field, value=path,
                              fix="write the database URL into it")  # fmt: skip
    return value.splitlines()[0].strip()


def build_limiter(redis_url: str | None, sync_s: float) -> Limiter:
    """Memory without Redis; with it, leased credit settled every `sync_s` (0: exact)."""
    if not redis_url:
        return MemoryLimiter()
    if sync_s > 0:
        return LeasedRedisLimiter(redis_url, sync_s=sync_s)
    return RedisLimiter(redis_url)


def redis_sync_s(spec: FleetSpec | None) -> float:
    """`$INFERPLANE_REDIS_SYNC_S`, else the fleet's `gateway.redis_sync_s`."""
    from inferplane.errors import InferplaneError

    raw = os.environ.get(REDIS_SYNC_ENV)
    if raw is None:
        return spec.gateway.redis_sync_s if spec is not None else 0.5
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 10:
        raise InferplaneError("not a number of seconds from 0 to 10", field=REDIS_SYNC_ENV,
                              value=raw, fix="e.g. 0.5 (leased credit) or 0 (exact)")  # fmt: skip
    return value


def build_tenancy(
    spec: FleetSpec | None,
    db: str | None = None,
    *,
    default_db: str | None = None,
    announce: bool = True,
    ratelimit_headers: RateLimitHeaders | None = None,
    spill_path: Path | None = None,
) -> Tenancy:
    """Keys, limits, usage ledger and DB routes for a gateway serving `spec`;
    `ratelimit_headers` overrides the fleet's `gateway.ratelimit_headers`; usage rows a
    down database refused at shutdown go to `spill_path` (default `.inferplane/`)."""
    gw = spec.gateway if spec is not None else None
    per_key = spec.limits.per_key if spec is not None else None
    redis_url = os.environ.get(REDIS_URL_ENV) or (gw.redis_url if gw else None)
    return Tenancy(
        Store(tenancy_database_url(spec, db, default_db)),
        build_limiter(redis_url, redis_sync_s(spec)),
        auth=gw.auth if gw else "auto",
        default_limits=Limits(per_key.rpm, per_key.tpm, per_key.max_concurrent)
        if per_key is not None
        else None,
        admin_token=os.environ.get(gw.admin_token_env if gw else DEFAULT_ADMIN_TOKEN_ENV),
        seed=[
            (r.model, tuple((b.target, float(b.weight)) for b in r.backends))
            for r in (spec.routes if spec is not None else [])
        ],
        announce=announce,
        ratelimit_headers=ratelimit_headers or (gw.ratelimit_headers if gw else "on_429"),
        spill_path=spill_path or Path(".inferplane") / USAGE_SPILL_FILE,
    )
