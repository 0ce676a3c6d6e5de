"""Evaluation sets: held-out items per policy, runs of a version on a set, per-item results.

The promotion's evaluation gate (apprentice/evalsets/gate.py) compares the version about to
become the canary with the promoted one item by item on these (docs/evaluation-sets.md).

Revision ID: 0016
Revises: 0015 (calls partitioned)
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "eval_sets",
        sa.Column("id", UUID(as_uuid=True), primary_key=True),
        sa.Column("policy", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("description", sa.Text),
        sa.Column("scoring", JSONB, nullable=False),
        sa.Column("created_by", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_index("uq_eval_sets_policy_name", "eval_sets", ["policy", "name"], unique=True)
    op.create_table(
        "eval_items",
        sa.Column("id", UUID(as_uuid=True), primary_key=True),
        sa.Column("set_id", UUID(as_uuid=True), sa.ForeignKey("eval_sets.id", ondelete="CASCADE"), nullable=False),
        sa.Column("messages", JSONB, nullable=False),
        sa.Column("source_trajectory_id", UUID(as_uuid=True)),
        sa.Column("scoring", JSONB),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_index("ix_eval_items_set", "eval_items", ["set_id", "created_at"])
    op.create_table(
        "eval_runs",
        sa.Column("id", UUID(as_uuid=True), primary_key=True),
        sa.Column("set_id", UUID(as_uuid=True), sa.ForeignKey("eval_sets.id", ondelete="CASCADE"), nullable=False),
        sa.Column("policy", sa.Text, nullable=False),
        sa.Column("adapter_version_id", UUID(as_uuid=True), sa.ForeignKey("adapter_versions.id")),
        sa.Column("target", sa.Text, nullable=False),
        sa.Column("trigger", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default="running"),
        sa.Column("items", sa.Integer, nullable=False, server_default="0"),
        sa.Column("scored", sa.Integer, nullable=False, server_default="0"),
        sa.Column("mean", sa.Double),
        sa.Column("error", sa.Text),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint("status IN ('running', 'finished', 'failed')", name="ck_eval_runs_status"),
    )
    op.create_index("ix_eval_runs_set_target", "eval_runs", ["set_id", "target", "started_at"])
    op.create_index("ix_eval_runs_version", "eval_runs", ["adapter_version_id"])
    op.create_table(
        "eval_results",
        sa.Column("run_id", UUID(as_uuid=True), sa.ForeignKey("eval_runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("item_id", UUID(as_uuid=True), sa.ForeignKey("eval_items.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("score", sa.Double),
        sa.Column("answer", sa.Text),
        sa.Column("detail", sa.Text),
    )


def downgrade() -> None:
    op.drop_table("eval_results")
    op.drop_table("eval_runs")
    op.drop_table("eval_items")
    op.drop_table("eval_sets")
