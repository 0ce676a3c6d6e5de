"""LLM judging: one row per judged group, and the judgement a judge's reward came from.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "judgements",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("policy", sa.Text, nullable=False),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("group_key", sa.Text, nullable=False),
        sa.Column("chunk", sa.Integer, nullable=False, server_default="0"),
        sa.Column("judge_model", sa.Text, nullable=False),
        sa.Column("rubric_hash", sa.Text, nullable=False),
        sa.Column("mode", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default="running"),
        sa.Column("reason", sa.Text),
        sa.Column("trajectory_ids", pg.ARRAY(pg.UUID(as_uuid=True)), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("prompt_tokens", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("completion_tokens", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("judge_trajectory", sa.Text),
        sa.Column("answer", pg.JSONB),
        sa.Column("lease_until", sa.DateTime(timezone=True)),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint("status IN ('running', 'judged', 'failed')", name="ck_judgements_status"),
    )
    op.create_index(
        "uq_judgements_group",
        "judgements",
        ["policy", "tenant", "group_key", "chunk", "judge_model", "rubric_hash"],
        unique=True,
    )
    op.create_index("ix_judgements_policy_started", "judgements", ["policy", "started_at"])
    op.add_column("rewards", sa.Column("judgement_id", pg.UUID(as_uuid=True)))
    op.create_index(
        "ix_rewards_judgement", "rewards", ["judgement_id"], postgresql_where=sa.text("judgement_id IS NOT NULL")
    )


def downgrade() -> None:
    op.drop_index("ix_rewards_judgement", table_name="rewards")
    op.drop_column("rewards", "judgement_id")
    op.drop_table("judgements")
