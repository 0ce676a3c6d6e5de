"""Rate-limit counters shared between gateway processes.

Each gateway process keeps its own counts of requests, tokens and spend per key and tenant in
memory (the request path never waits on the database) and, about every second, upserts its
current windows here and reads the sum of the other processes' rows. Rows of windows that have
passed are deleted by the same step, so the table stays a few rows per active key and process.
Logged like any table: a day's spend must survive a restart of PostgreSQL (and a restarted
gateway process finds its earlier counts here, under its old process id, as another's).

Revision ID: 0011
Revises: 0010 (training_runs.kind)
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "limit_counters",
        sa.Column("process_id", sa.Text, nullable=False),
        sa.Column("scope", sa.Text, nullable=False),
        sa.Column("window_s", sa.Integer, nullable=False),
        sa.Column("window_index", sa.BigInteger, nullable=False),
        sa.Column("requests", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("tokens", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("spend_usd", sa.Double, nullable=False, server_default="0"),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("process_id", "scope", "window_s", "window_index"),
    )


def downgrade() -> None:
    op.drop_table("limit_counters")
