"""Initial tables: teams, api_keys, route_rules, usage.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "teams",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_teams"),
        sa.UniqueConstraint("name", name="uq_teams_name"),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=True),
        sa.Column("prefix", sa.String(20), nullable=False),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=True),
        sa.Column("revoked_at", sa.Float(), nullable=True),
        sa.Column("rotated_at", sa.Float(), nullable=True),
        sa.Column("allowed_models", sa.JSON(), nullable=True),
        sa.Column("rpm", sa.Integer(), nullable=True),
        sa.Column("tpm", sa.Integer(), nullable=True),
        sa.Column("max_concurrent", sa.Integer(), nullable=True),
        sa.Column("budget_tokens", sa.BigInteger(), nullable=True),
        sa.Column("budget_period", sa.String(10), nullable=False),
        sa.Column("priority", sa.String(12), nullable=False),
        sa.ForeignKeyConstraint(
            ["team_id"], ["teams.id"], name="fk_api_keys_team_id_teams"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_api_keys"),
        sa.UniqueConstraint("secret_hash", name="uq_api_keys_secret_hash"),
    )
    op.create_table(
        "route_rules",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("route", sa.String(200), nullable=False),
        sa.Column("target", sa.String(200), nullable=False),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("key_id", sa.String(40), nullable=True),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["key_id"],
            ["api_keys.id"],
            name="fk_route_rules_key_id_api_keys",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_route_rules"),
    )
    op.create_index("ix_route_rules_route", "route_rules", ["route"])
    op.create_table(
        "usage",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("request_id", sa.String(128), nullable=False),
        sa.Column("key_id", sa.String(40), nullable=True),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("replica", sa.String(300), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("stream", sa.Boolean(), nullable=False),
        sa.Column("duration_s", sa.Float(), nullable=False),
        sa.Column("ttft_s", sa.Float(), nullable=False),
        sa.Column("queue_wait_s", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_usage"),
    )
    op.create_index("ix_usage_ts_key", "usage", ["ts", "key_id"])


def downgrade() -> None:
    op.drop_index("ix_usage_ts_key", table_name="usage")
    op.drop_table("usage")
    op.drop_index("ix_route_rules_route", table_name="route_rules")
    op.drop_table("route_rules")
    op.drop_table("api_keys")
    op.drop_table("teams")
