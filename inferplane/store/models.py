"""Table definitions. Changing one means adding an Alembic revision under `migrations/`
(`tests/test_store_migrations.py` fails while the two disagree)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Team(Base):
    """A team or project that owns keys; usage can be grouped by it."""

    __tablename__ = "teams"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[float] = mapped_column(Float)


class ApiKey(Base):
    """One API key and its policy. Only a SHA-256 of the secret is stored (secrets are 256
    random bits, so a fast hash is enough); `prefix` is shown in listings to tell keys apart.
    Unset limits (NULL) mean unlimited."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    team_id: Mapped[int | None] = mapped_column(ForeignKey("teams.id"), nullable=True)
    prefix: Mapped[str] = mapped_column(String(20))
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    rotated_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    allowed_models: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    rpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_concurrent: Mapped[int | None] = mapped_column(Integer, nullable=True)
    budget_tokens: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    budget_period: Mapped[str] = mapped_column(String(10), default="month")
    priority: Mapped[str] = mapped_column(String(12), default="interactive")

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "team_id": self.team_id,
            "prefix": self.prefix,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "revoked_at": self.revoked_at,
            "rotated_at": self.rotated_at,
            "allowed_models": self.allowed_models,
            "rpm": self.rpm,
            "tpm": self.tpm,
            "max_concurrent": self.max_concurrent,
            "budget_tokens": self.budget_tokens,
            "budget_period": self.budget_period,
            "priority": self.priority,
        }


class RouteRule(Base):
    """One weighted target of a client-facing name. Rows with `key_id` set are per-key
    overrides: that key's requests for `route` go to these targets instead."""

    __tablename__ = "route_rules"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    route: Mapped[str] = mapped_column(String(200), index=True)
    target: Mapped[str] = mapped_column(String(200))
    weight: Mapped[float] = mapped_column(Float)
    key_id: Mapped[str | None] = mapped_column(
        ForeignKey("api_keys.id", ondelete="CASCADE"), nullable=True
    )
    updated_at: Mapped[float] = mapped_column(Float)


class UsageRow(Base):
    """One request in the usage ledger (metadata only, never prompts: P44)."""

    __tablename__ = "usage"
    __table_args__ = (Index("ix_usage_ts_key", "ts", "key_id"),)

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    ts: Mapped[float] = mapped_column(Float)
    request_id: Mapped[str] = mapped_column(String(128))
    key_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    model: Mapped[str] = mapped_column(String(200))
    replica: Mapped[str] = mapped_column(String(300))
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    completion_tokens: Mapped[int] = mapped_column(Integer)
    status: Mapped[int] = mapped_column(Integer)
    stream: Mapped[bool] = mapped_column(Boolean)
    duration_s: Mapped[float] = mapped_column(Float)
    ttft_s: Mapped[float] = mapped_column(Float)
    queue_wait_s: Mapped[float] = mapped_column(Float)
