"""Unserved attempts: answers the gateway asked for to explore, that no client ever saw.

- `trajectories.served` (default true): false for a trajectory that holds an exploration
  sample (gateway/exploration): the lineage head's extra answer to a served call's request,
  recorded in that call's group so that the learner compares it with its siblings. The canary's
  arms, which compare what clients were served, must leave such trajectories out.
- `calls.explores_call_id`: the served call whose request an unserved attempt answered (NULL for
  every call a client made).

Revision ID: 0015
Revises: 0013 (calls partitioned)
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A constant default: PostgreSQL 11+ adds the column without rewriting the table.
    op.add_column("trajectories", sa.Column("served", sa.Boolean, nullable=False, server_default=sa.text("true")))
    op.add_column("calls", sa.Column("explores_call_id", sa.dialects.postgresql.UUID(as_uuid=True)))


def downgrade() -> None:
    op.drop_column("calls", "explores_call_id")
    op.drop_column("trajectories", "served")
