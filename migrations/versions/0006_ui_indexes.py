"""Indexes for the web dashboard (/ui): every page reads a bounded, index-ordered slice.

- trajectories (last_call_at, id): the trajectory list without a policy filter, newest first,
  keyset-paged on (last_call_at, id);
- rewards (received_at): rewards per minute on the overview (the last minutes only);
- adapter_transitions (policy, id): a policy's transitions newest first, keyset-paged on id.

A policy's versions (uq_adapter_versions_policy_version), training runs
(ix_training_runs_policy_started) and one version's transitions (ix_adapter_transitions_version)
already have theirs (0003).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

INDEXES = [
    ("ix_trajectories_last_call", "trajectories", ["last_call_at", "id"]),
    ("ix_rewards_received", "rewards", ["received_at"]),
    ("ix_adapter_transitions_policy", "adapter_transitions", ["policy", "id"]),
]


def upgrade() -> None:
    for name, table, columns in INDEXES:
        op.create_index(name, table, columns)


def downgrade() -> None:
    for name, table, _ in reversed(INDEXES):
        op.drop_index(name, table_name=table)
