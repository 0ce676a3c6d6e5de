"""Each run records the canary arm it was assigned, the share it was drawn at, its unit and task.

The canary is an experiment whose unit is the run (or the client's group, or the client's
trajectory id): the arm is drawn with probability equal to the canary share, independently of
the prompt (gateway/policies/versions.py). The analysis is by assigned arm, so the assignment is
recorded with the run's first call: `arm` ('canary' or 'incumbent'; NULL when no canary served),
`arm_version_id` (the version the arm pointed to), `arm_share` (the probability of the canary's
arm at that moment), `arm_unit` (what was randomised: 'group:<id>', 'client:<id>' or
'run:<trajectory id>') and `task_key` (the task hash of apprentice/grouping.py: the stratum the
canary compares within). See apprentice/promotion/sequential.py.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("trajectories", sa.Column("arm", sa.Text))
    op.add_column("trajectories", sa.Column("arm_version_id", UUID(as_uuid=True)))
    op.add_column("trajectories", sa.Column("arm_share", sa.Double))
    op.add_column("trajectories", sa.Column("arm_unit", sa.Text))
    op.add_column("trajectories", sa.Column("task_key", sa.Text))
    op.create_check_constraint("trajectories_arm", "trajectories", "arm IN ('canary', 'incumbent')")
    # The canary's evaluation reads a policy's assigned runs since the lineage's first canary.
    op.create_index(
        "ix_trajectories_policy_arm_first_call",
        "trajectories",
        ["policy", "first_call_at"],
        postgresql_where=sa.text("arm IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_trajectories_policy_arm_first_call", table_name="trajectories")
    op.drop_constraint("trajectories_arm", "trajectories", type_="check")
    for column in ("task_key", "arm_unit", "arm_share", "arm_version_id", "arm"):
        op.drop_column("trajectories", column)
