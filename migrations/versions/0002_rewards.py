"""Rewards (delayed, idempotent, linked to trajectories when they land) and webhook signatures.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rewards",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("seq", sa.BigInteger, sa.Identity(always=False), nullable=False),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("target_kind", sa.Text, nullable=False),
        sa.Column("target", sa.Text, nullable=False),
        sa.Column("target_trajectory_id", pg.UUID(as_uuid=True)),
        sa.Column("target_call", sa.Text),
        sa.Column("trajectory_id", pg.UUID(as_uuid=True)),
        sa.Column("status", sa.Text, nullable=False, server_default="pending"),
        sa.Column("reject_reason", sa.Text),
        sa.Column("name", sa.Text, nullable=False, server_default="reward"),
        sa.Column("value", sa.Double, nullable=False),
        sa.Column("metrics", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("comment", sa.Text),
        sa.Column("group_id", sa.Text),
        sa.Column("idempotency_key", sa.Text),
        sa.Column("content_hash", sa.LargeBinary, nullable=False),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("api_key_id", pg.UUID(as_uuid=True)),
        sa.Column("observed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("linked_at", sa.DateTime(timezone=True)),
        sa.Column("superseded_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint("status IN ('pending', 'linked', 'rejected')", name="ck_rewards_status"),
        sa.CheckConstraint("(status = 'pending') = (trajectory_id IS NULL)", name="ck_rewards_linked"),
    )
    # The learner's query: current rewards of a trajectory.
    op.create_index(
        "ix_rewards_current",
        "rewards",
        ["trajectory_id", "name"],
        postgresql_where=sa.text("status = 'linked' AND superseded_at IS NULL"),
    )
    # A trajectory's rewards, newest first per name: finds the current one without reading history.
    op.create_index(
        "ix_rewards_slot",
        "rewards",
        ["trajectory_id", "name", sa.text("observed_at DESC"), sa.text("seq DESC")],
        postgresql_where=sa.text("trajectory_id IS NOT NULL"),
    )
    op.create_index("ix_rewards_pending", "rewards", ["received_at"], postgresql_where=sa.text("status = 'pending'"))
    op.create_index(
        "uq_rewards_idempotency",
        "rewards",
        ["tenant", "idempotency_key", "content_hash"],
        unique=True,
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    )
    op.create_table(
        "reward_signatures",
        sa.Column("signature", sa.LargeBinary, primary_key=True),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("signed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_index("ix_reward_signatures_signed_at", "reward_signatures", ["signed_at"])


def downgrade() -> None:
    op.drop_table("reward_signatures")
    op.drop_table("rewards")
