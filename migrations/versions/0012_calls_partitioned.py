"""`calls` becomes a table partitioned by time (RANGE on created_at), so old history is dropped
a partition at a time instead of deleted row by row (docs/history.md).

- The primary key becomes (id, created_at): PostgreSQL requires the partition key in every
  unique index of a partitioned table. Exactly-once ingestion still holds: a journal line's
  `created_at` never changes between retries, so a re-shipped line meets its own row
  (`ON CONFLICT (id, created_at)` in gateway/store/calls.py).
- Existing rows move into one partition per calendar month (the current month's ends at
  today's midnight UTC); from today on, one partition per day for a week ahead. The periodic
  maintenance (apprentice/store/history.py) continues from the last upper bound with the
  configured interval (`history.partition_interval`), so bounds stay contiguous even when the
  interval changes.
- A DEFAULT partition takes rows outside every range (a clock far off) and the rows retention
  keeps from a dropped partition (untrained or lineage training data).
- The indexes are recreated on the partitioned table (each partition gets its own).

The downgrade copies every row back into a plain table with the primary key (id).

Revision ID: 0012
Revises: 0011 (limit_counters)
Create Date: 2026-12-01
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

DAYS_AHEAD = 7

# name, columns, partial-index predicate; the same as apprentice/store/tables.py.
_INDEXES: list[tuple[str, str, str | None]] = [
    ("ix_calls_response_id", "response_id", None),
    ("ix_calls_trajectory", "trajectory_id, created_at", None),
    ("ix_calls_policy_created", "policy, created_at", None),
    ("ix_calls_continuation_key", "continuation_key", None),
    ("ix_calls_parent_key_pending", "parent_key", "stitch_pending"),
]


def _create_indexes() -> None:
    for name, columns, where in _INDEXES:
        op.execute(f"CREATE INDEX {name} ON calls ({columns})" + (f" WHERE {where}" if where else ""))


def _drop_indexes() -> None:
    for name, _, _ in _INDEXES:
        op.execute(f"DROP INDEX IF EXISTS {name}")


def _partition(lower: datetime, upper: datetime) -> None:
    name = f"calls_p{lower:%Y%m%d}"
    op.execute(
        f"CREATE TABLE {name} PARTITION OF calls FOR VALUES FROM ('{lower.isoformat()}') TO ('{upper.isoformat()}')"
    )


def _month_start(moment: datetime) -> datetime:
    return moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def _next_month(moment: datetime) -> datetime:
    return (moment.replace(day=28) + timedelta(days=4)).replace(day=1)


def upgrade() -> None:
    bind = op.get_bind()
    op.execute("LOCK TABLE calls IN ACCESS EXCLUSIVE MODE")
    oldest = bind.execute(sa.text("SELECT min(created_at) FROM calls")).scalar()
    op.execute("ALTER TABLE calls RENAME TO calls_unpartitioned")
    op.execute("ALTER TABLE calls_unpartitioned RENAME CONSTRAINT calls_pkey TO calls_unpartitioned_pkey")
    _drop_indexes()
    op.execute(
        "CREATE TABLE calls (LIKE calls_unpartitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS) "
        "PARTITION BY RANGE (created_at)"
    )
    today = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    if oldest is not None and oldest < today:
        lower = _month_start(oldest.astimezone(timezone.utc))
        while lower < today:
            upper = min(_next_month(lower), today)
            _partition(lower, upper)
            lower = upper
    for day in range(DAYS_AHEAD + 1):
        _partition(today + timedelta(days=day), today + timedelta(days=day + 1))
    op.execute("CREATE TABLE calls_default PARTITION OF calls DEFAULT")
    op.execute("INSERT INTO calls SELECT * FROM calls_unpartitioned")
    op.execute("DROP TABLE calls_unpartitioned")
    op.execute("ALTER TABLE calls ADD CONSTRAINT calls_pkey PRIMARY KEY (id, created_at)")
    _create_indexes()
    op.execute("ANALYZE calls")


def downgrade() -> None:
    op.execute("LOCK TABLE calls IN ACCESS EXCLUSIVE MODE")
    op.execute("ALTER TABLE calls RENAME TO calls_partitioned")
    op.execute("ALTER TABLE calls_partitioned RENAME CONSTRAINT calls_pkey TO calls_partitioned_pkey")
    _drop_indexes()
    op.execute("CREATE TABLE calls (LIKE calls_partitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
    # The same id twice (possible only under the composite key) keeps its first row.
    op.execute("INSERT INTO calls SELECT DISTINCT ON (id) * FROM calls_partitioned ORDER BY id, created_at")
    op.execute("DROP TABLE calls_partitioned")  # drops its partitions too
    op.execute("ALTER TABLE calls ADD CONSTRAINT calls_pkey PRIMARY KEY (id)")
    _create_indexes()
