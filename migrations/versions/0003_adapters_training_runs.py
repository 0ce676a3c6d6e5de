"""Adapter versions, training runs, their transitions, and per-policy learning state.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

STATUSES = "('candidate', 'canary', 'promoted', 'retired', 'rejected')"


def upgrade() -> None:
    op.create_table(
        "training_runs",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("policy", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default="running"),
        sa.Column("trigger", sa.Text, nullable=False, server_default="manual"),
        sa.Column("host", sa.Text),
        sa.Column("pid", sa.Integer),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.Column("from_version_id", pg.UUID(as_uuid=True)),
        sa.Column("produced_version_id", pg.UUID(as_uuid=True)),
        sa.Column("trajectories", sa.Integer),
        sa.Column("groups", sa.Integer),
        sa.Column("groups_equal_rewards", sa.Integer),
        sa.Column("groups_greedy", sa.Integer),
        sa.Column("samples", sa.Integer),
        sa.Column("tokens", sa.BigInteger),
        sa.Column("loss", sa.Double),
        sa.Column("mean_reward", sa.Double),
        sa.Column("mean_advantage", sa.Double),
        sa.Column("kl", sa.Double),
        sa.Column("clip_fraction", sa.Double),
        sa.Column("duration_s", sa.Double),
        sa.Column("code_version", sa.Text),
        sa.Column("config", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("metrics", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("error", sa.Text),
        sa.CheckConstraint(
            "status IN ('running', 'succeeded', 'failed', 'aborted', 'skipped')", name="ck_training_runs_status"
        ),
    )
    op.create_index("ix_training_runs_policy_started", "training_runs", ["policy", "started_at"])
    op.create_table(
        "adapter_versions",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("policy", sa.Text, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        # The LoRA name inference endpoints know it by (vLLM's lora_name), e.g. "support-agent-v3".
        sa.Column("name", sa.Text, nullable=False, unique=True),
        sa.Column("status", sa.Text, nullable=False, server_default="candidate"),
        sa.Column("base_model", sa.Text, nullable=False),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("parent_version_id", pg.UUID(as_uuid=True), sa.ForeignKey("adapter_versions.id")),
        sa.Column("training_run_id", pg.UUID(as_uuid=True), sa.ForeignKey("training_runs.id")),
        sa.Column("rank", sa.Integer),
        sa.Column("alpha", sa.Double),
        sa.Column("target_modules", pg.JSONB),
        # Share of new trajectories that a canary serves.
        sa.Column("canary_share", sa.Double),
        sa.Column("gates", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("evaluation", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("files_deleted_at", sa.DateTime(timezone=True)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.UniqueConstraint("policy", "version", name="uq_adapter_versions_policy_version"),
        sa.CheckConstraint(f"status IN {STATUSES}", name="ck_adapter_versions_status"),
    )
    op.create_index("ix_adapter_versions_policy_status", "adapter_versions", ["policy", "status"])
    # At most one promoted and one canary version per policy at any time.
    op.create_index(
        "uq_adapter_versions_promoted",
        "adapter_versions",
        ["policy"],
        unique=True,
        postgresql_where=sa.text("status = 'promoted'"),
    )
    op.create_index(
        "uq_adapter_versions_canary",
        "adapter_versions",
        ["policy"],
        unique=True,
        postgresql_where=sa.text("status = 'canary'"),
    )
    op.create_table(
        "adapter_transitions",
        sa.Column("id", sa.BigInteger, sa.Identity(always=False), primary_key=True),
        sa.Column("adapter_version_id", pg.UUID(as_uuid=True), sa.ForeignKey("adapter_versions.id"), nullable=False),
        sa.Column("policy", sa.Text, nullable=False),
        sa.Column("from_status", sa.Text),
        sa.Column("to_status", sa.Text, nullable=False),
        # The admin key's name, or "auto" for the learner and the canary evaluator.
        sa.Column("actor", sa.Text, nullable=False),
        sa.Column("reason", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_index("ix_adapter_transitions_version", "adapter_transitions", ["adapter_version_id", "created_at"])
    op.create_table(
        "policy_state",
        sa.Column("policy", sa.Text, primary_key=True),
        sa.Column("learning_paused", sa.Boolean, nullable=False, server_default="false"),
        sa.Column("updated_by", sa.Text),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    # Selection of untrained trajectories of a policy.
    op.create_index(
        "ix_trajectories_untrained",
        "trajectories",
        ["policy", "last_call_at"],
        postgresql_where=sa.text("trained_in_run_id IS NULL AND merged_into IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_trajectories_untrained", table_name="trajectories")
    op.drop_table("policy_state")
    op.drop_table("adapter_transitions")
    op.drop_table("adapter_versions")
    op.drop_table("training_runs")
