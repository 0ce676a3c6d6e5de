"""Indexes for the dashboard with a large history (bench/dashboard_pages.py: 1,000,000 calls,
10,000 versions of one policy; every page under 300 ms).

- trajectories (adapter_version_id, last_call_at, id), where a version served the first call:
  the trajectory list filtered by version, newest first, keyset-paged on (last_call_at, id); it
  read the whole table (a parallel sequential scan) to find a version's few dozen trajectories.
- trajectories (policy, first_call_at): the canary's evaluation (`evaluation.lineage_rewards`,
  `arm_rewards`: a policy's trajectories started since the lineage's first canary), which the
  version page of a canary computes live, as the admin API does; it read every trajectory of the
  policy. The promotion job's evaluation reads the same rows.
- trajectories (trained_in_run_id), where set: a version's provenance ("sampled by": the
  trajectories its training run trained on, grouped by the version that sampled them), on the
  version page and in the admin API's version detail and listing; it read the whole table.
- rewards (name, value) INCLUDE (trajectory_id), current rows only: the trajectory list filtered
  by a reward range that the newest trajectories rarely reach reads the range's rewards
  (`gateway.ui.queries.trajectories_page`) instead of probing the reward of every trajectory
  back through the history.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_trajectories_version_last_call",
        "trajectories",
        ["adapter_version_id", "last_call_at", "id"],
        postgresql_where=sa.text("adapter_version_id IS NOT NULL"),
    )
    op.create_index("ix_trajectories_policy_first_call", "trajectories", ["policy", "first_call_at"])
    op.create_index(
        "ix_trajectories_trained_in_run",
        "trajectories",
        ["trained_in_run_id"],
        postgresql_where=sa.text("trained_in_run_id IS NOT NULL"),
    )
    op.create_index(
        "ix_rewards_current_value",
        "rewards",
        ["name", "value"],
        postgresql_include=["trajectory_id"],
        postgresql_where=sa.text("status = 'linked' AND superseded_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_rewards_current_value", table_name="rewards")
    op.drop_index("ix_trajectories_trained_in_run", table_name="trajectories")
    op.drop_index("ix_trajectories_policy_first_call", table_name="trajectories")
    op.drop_index("ix_trajectories_version_last_call", table_name="trajectories")
