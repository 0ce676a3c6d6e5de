"""A judgement is unique by the set of trajectories it judged, not by its group's name.

A group is the same task; its members change: attempts that arrive after the group was judged,
and the same task run again another day. Keyed by the group's name, those were never judged.
Keyed by its members, a group with new members is judged again as a whole (its members' newer
scores replace the older ones), and the same members are still never judged twice.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

MEMBERS_KEY = "md5(array_to_string(ARRAY(SELECT m::text FROM unnest(trajectory_ids) AS m ORDER BY 1), ','))"


def upgrade() -> None:
    op.add_column("judgements", sa.Column("members_key", sa.Text))
    op.execute(f"UPDATE judgements SET members_key = {MEMBERS_KEY}")
    op.alter_column("judgements", "members_key", nullable=False)
    op.drop_index("uq_judgements_group", table_name="judgements")
    op.create_index(
        "uq_judgements_members", "judgements", ["policy", "judge_model", "rubric_hash", "members_key"], unique=True
    )
    op.create_index("ix_judgements_group", "judgements", ["policy", "tenant", "group_key"])
    # Which trajectories a judge has judged: `trajectory_ids && ...` (gateway/judging/store.py).
    op.create_index("ix_judgements_members", "judgements", ["trajectory_ids"], postgresql_using="gin")


def downgrade() -> None:
    op.drop_index("ix_judgements_members", table_name="judgements")
    op.drop_index("ix_judgements_group", table_name="judgements")
    op.drop_index("uq_judgements_members", table_name="judgements")
    op.create_index(
        "uq_judgements_group",
        "judgements",
        ["policy", "tenant", "group_key", "chunk", "judge_model", "rubric_hash"],
        unique=True,
    )
    op.drop_column("judgements", "members_key")
