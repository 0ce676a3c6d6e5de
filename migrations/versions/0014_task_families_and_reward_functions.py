"""Task families on trajectories, and the reward functions' scorings.

`trajectories.task_family` holds apprentice.grouping.task_family of a run's first call (the
client's X-Task-Family, else a hash of its system prompt and tools, else the policy): the
learner's baseline for prompts that never repeat reads a family's recent rewards by it, and the
canary's strata are families. Older rows stay NULL: the learner computes their family from the
first call when it needs it.

`function_scorings`: one row per trajectory scored by a policy's reward function (claims,
attempts, the hourly budget across gateway processes).

Revision ID: 0014
Revises: 0019
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision = "0014"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("trajectories", sa.Column("task_family", sa.Text))
    op.create_index(
        "ix_trajectories_policy_family_last_call",
        "trajectories",
        ["policy", "task_family", "last_call_at"],
        postgresql_where=sa.text("task_family IS NOT NULL"),
    )
    op.create_table(
        "function_scorings",
        sa.Column(
            "trajectory_id",
            UUID(as_uuid=True),
            sa.ForeignKey("trajectories.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("policy", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default="running"),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="1"),
        sa.Column("value", sa.Double),
        sa.Column("error", sa.Text),
        sa.Column("lease_until", sa.DateTime(timezone=True)),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint("status IN ('running', 'scored', 'failed')", name="ck_function_scorings_status"),
    )
    op.create_index("ix_function_scorings_budget", "function_scorings", ["policy", "name", "started_at"])


def downgrade() -> None:
    op.drop_index("ix_function_scorings_budget", table_name="function_scorings")
    op.drop_table("function_scorings")
    op.drop_index("ix_trajectories_policy_family_last_call", table_name="trajectories")
    op.drop_column("trajectories", "task_family")
