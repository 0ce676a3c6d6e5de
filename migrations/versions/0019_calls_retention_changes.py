"""The changes made to a partition of `calls` while retention copies its kept rows.

Retention (apprentice/store/history.py) copies the rows it keeps from a partition about to be
dropped *before* it takes ACCESS EXCLUSIVE on `calls` (the copy of a day's partition takes
seconds; the shipper must not wait that long). Writes to that partition meanwhile (a late
journal line, a stitch merge, a trajectory's deletion) are recorded here by a row trigger that
retention puts on that partition only, and are applied to the copy under the lock, by primary
key. The partition's rows are dropped with it; these rows are deleted when the pass ends.

Revision ID: 0019
Revises: 0016
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision = "0019"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "calls_retention_changes",
        sa.Column("partition", sa.Text(), nullable=False),
        sa.Column("call_id", UUID(as_uuid=True), nullable=False),
        sa.Column("operation", sa.Text(), nullable=False),
    )
    op.create_index("ix_calls_retention_changes_partition", "calls_retention_changes", ["partition"])
    op.execute(
        """
        CREATE FUNCTION calls_retention_change() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'DELETE' THEN
                INSERT INTO calls_retention_changes VALUES (TG_TABLE_NAME, OLD.id, TG_OP);
            ELSE
                INSERT INTO calls_retention_changes VALUES (TG_TABLE_NAME, NEW.id, TG_OP);
            END IF;
            RETURN NULL;
        END
        $$
        """
    )


def downgrade() -> None:
    op.execute("DROP FUNCTION IF EXISTS calls_retention_change() CASCADE")
    op.drop_table("calls_retention_changes")
