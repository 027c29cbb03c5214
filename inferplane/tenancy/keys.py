"""API keys: create, list, revoke, rotate. The secret is returned once and stored hashed."""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass

from sqlalchemy import func, select

from inferplane.errors import InferplaneError
from inferplane.store import ApiKey, Store, Team
from inferplane.tenancy.limits import BUDGET_PERIODS, Limits

SECRET_PREFIX = "ip-"
PRIORITIES = ("interactive", "batch")


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True, slots=True)
class KeyPolicy:
    """What the gateway needs to know about a key on the hot path (cached in memory)."""

    id: str
    name: str
    limits: Limits
    allowed_models: frozenset[str] | None = None
    priority: str = "interactive"
    expires_at: float | None = None

    @classmethod
    def from_row(cls, row: ApiKey) -> KeyPolicy:
        return cls(
            id=row.id,
            name=row.name,
            limits=Limits(
                row.rpm, row.tpm, row.max_concurrent, row.budget_tokens, row.budget_period
            ),
            allowed_models=frozenset(row.allowed_models) if row.allowed_models else None,
            priority=row.priority,
            expires_at=row.expires_at,
        )


def _check_positive(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise InferplaneError(
            "limit must be a positive integer", field=name, value=value, fix="omit it for no limit"
        )


async def create_key(
    store: Store,
    name: str,
    *,
    team: str | None = None,
    models: list[str] | None = None,
    rpm: int | None = None,
    tpm: int | None = None,
    max_concurrent: int | None = None,
    budget_tokens: int | None = None,
    budget_period: str = "month",
    priority: str = "interactive",
    expires_in_s: float | None = None,
    now: float | None = None,
) -> tuple[ApiKey, str]:
    """A new key and its secret (shown once; only its hash is stored)."""
    if not name:
        raise InferplaneError("a key needs a name", field="name", fix="e.g. 'search-team'")
    for field, value in (
        ("rpm", rpm), ("tpm", tpm), ("max_concurrent", max_concurrent),
        ("budget_tokens", budget_tokens),
    ):  # fmt: skip
        _check_positive(field, value)
    if budget_period not in BUDGET_PERIODS:
        raise InferplaneError(
            "unknown budget period", field="budget_period", value=budget_period,
            fix=f"use one of {', '.join(BUDGET_PERIODS)}",
        )  # fmt: skip
    if priority not in PRIORITIES:
        raise InferplaneError(
            "unknown priority class", field="priority", value=priority,
            fix=f"use one of {', '.join(PRIORITIES)}",
        )  # fmt: skip
    if expires_in_s is not None and expires_in_s <= 0:
        raise InferplaneError(
            "expiry must be in the future", field="expires", value=expires_in_s,
            fix="give a positive duration",
        )  # fmt: skip
    now = time.time() if now is None else now
    secret = new_secret()
    async with store.session() as session:
        team_id = None
        if team:
            found = (await session.execute(select(Team).where(Team.name == team))).scalar()
            if found is None:
                found = Team(name=team, created_at=now)
                session.add(found)
                await session.flush()
            team_id = found.id
        row = ApiKey(
            id="key_" + secrets.token_hex(8),
            name=name,
            team_id=team_id,
            prefix=secret[:10],
            secret_hash=hash_secret(secret),
            created_at=now,
            expires_at=now + expires_in_s if expires_in_s is not None else None,
            allowed_models=sorted(set(models)) if models else None,
            rpm=rpm,
            tpm=tpm,
            max_concurrent=max_concurrent,
            budget_tokens=budget_tokens,
            budget_period=budget_period,
            priority=priority,
        )
        session.add(row)
        await session.commit()
    return row, secret


async def list_keys(store: Store, include_revoked: bool = False) -> list[ApiKey]:
    async with store.session() as session:
        query = select(ApiKey).order_by(ApiKey.created_at, ApiKey.id)
        if not include_revoked:
            query = query.where(ApiKey.revoked_at.is_(None))
        return list((await session.execute(query)).scalars())


async def _get(store: Store, key_id: str) -> ApiKey:
    async with store.session() as session:
        row = await session.get(ApiKey, key_id)
    if row is None:
        raise InferplaneError(
            "no such key", field="key", value=key_id, fix="see `inferplane keys list`"
        )
    return row


async def revoke_key(store: Store, key_id: str, now: float | None = None) -> ApiKey:
    await _get(store, key_id)
    async with store.session() as session:
        row = await session.get(ApiKey, key_id)
        assert row is not None
        if row.revoked_at is None:
            row.revoked_at = time.time() if now is None else now
        await session.commit()
    return row


async def rotate_key(store: Store, key_id: str, now: float | None = None) -> tuple[ApiKey, str]:
    """A new secret for the same key (same id, limits and usage); the old one stops working."""
    existing = await _get(store, key_id)
    if existing.revoked_at is not None:
        raise InferplaneError(
            "cannot rotate a revoked key", field="key", value=key_id, fix="create a new key"
        )
    secret = new_secret()
    async with store.session() as session:
        row = await session.get(ApiKey, key_id)
        assert row is not None
        row.secret_hash = hash_secret(secret)
        row.prefix = secret[:10]
        row.rotated_at = time.time() if now is None else now
        await session.commit()
    return row, secret


async def active_policies(store: Store, now: float) -> dict[str, KeyPolicy]:
    """secret hash -> policy for every key that is neither revoked nor expired."""
    async with store.session() as session:
        rows = (await session.execute(select(ApiKey).where(ApiKey.revoked_at.is_(None)))).scalars()
        return {
            r.secret_hash: KeyPolicy.from_row(r)
            for r in rows
            if r.expires_at is None or r.expires_at > now
        }


async def key_count(store: Store) -> int:
    """Keys ever created, revoked ones included (auth "auto" stays on once any exists)."""
    async with store.session() as session:
        return int((await session.execute(select(func.count()).select_from(ApiKey))).scalar_one())
