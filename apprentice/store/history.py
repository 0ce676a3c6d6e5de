"""Partitions of the `calls` table: created ahead of time, and dropped by retention.

`calls` is partitioned by RANGE on created_at (migration 0012, docs/history.md). Two jobs keep
it that way, run by every gateway process (gateway/history_maintenance.py) and by `apprentice db history`:

- **Creation.** Partitions exist `create_ahead_days` past now, so a shipped call never waits on
  DDL. Each new partition starts where the last one ends (bounds stay contiguous even when the
  interval setting changes). The new table is made on its own and then ATTACHed, which takes
  only SHARE UPDATE EXCLUSIVE on `calls` (inserts and reads go on; `CREATE TABLE ... PARTITION
  OF` would take ACCESS EXCLUSIVE). Rows that had landed in DEFAULT inside the new range (a
  clock far ahead) are moved into it first, and a CHECK on DEFAULT excluding the range, validated
  before the ATTACH, spares the ATTACH its scan of DEFAULT under ACCESS EXCLUSIVE. A range that
  overlaps another partition (gateways with different intervals during a rollout) is skipped.
- **Retention.** A partition whose whole range is older than `retention_days` is detached and
  dropped; the rows still needed are kept. Kept: calls of trajectories rewarded but not yet
  trained on, of trajectories trained by a run still running, and of trajectories that trained
  the promoted, canary and candidate versions and their ancestors (the serving lineage and what
  is about to serve: what an audit, a review or a rebuild of the adapter needs). Where the kept
  rows go depends on how many there are, so that no lock is held for a time that grows with them:
  at most SLICE_ROWS are put back into `calls`, where they land in the DEFAULT partition (no
  range covers them any more); more stay in a *remnant*, a table `<partition>_kept` built beside
  the partition and attached for the same range in its place (catalog work only: its indexes and
  a CHECK of its bounds are made beforehand, and a CHECK on DEFAULT spares the ATTACH its scan).
  Later passes delete the rows of DEFAULT and of remnants that nothing needs any more, row by
  row, and fold a remnant that has shrunk to SLICE_ROWS into DEFAULT. A remnant whose rows stay
  needed (a long serving lineage) stays a partition: one more per retained day at most.

Several gateway processes run this at once: every transaction first takes one advisory lock
without waiting and does nothing when another process holds it; DDL waits at most
`lock_timeout_s` for its table lock (a long dashboard query then delays a pass, never the
shipper for long), and a pass that gives up, on a lock timeout or as the victim PostgreSQL picks
in a deadlock, is simply run again by the next one. Retention locks `calls` before its
partitions, the order of every writer's UPDATE, so it waits on writers and they on it, never in
a cycle. The kept rows are copied before that lock, with a trigger recording the writes to the
old partition meanwhile; the lock is held only to apply those by key and swap the partition out
(for the remnant, or for at most SLICE_ROWS rows put into DEFAULT), so the shipper waits for a
time that grows neither with the partition nor with its kept rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

import psycopg
from psycopg import sql

from apprentice.settings import HistorySettings

log = logging.getLogger(__name__)
_T = TypeVar("_T")

HISTORY_LOCK_ID = 0x4150_4849  # pg advisory lock of the one process maintaining partitions
PARENT = "calls"
DEFAULT_PARTITION = "calls_default"
_NAME = re.compile(r"^calls_p\d{8}(_\d{4})?$")
REMNANT_SUFFIX = "_kept"
_REMNANT = re.compile(r"^calls_p\d{8}(_\d{4})?_kept$")
# Kept rows at most this many are put into DEFAULT under the lock (tens of milliseconds); more
# stay in a remnant partition, attached in place of the dropped one (module docstring).
SLICE_ROWS = 2_000

_PARTITIONS = """
SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) AS bound
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'calls'::regclass
"""
_BOUND = re.compile(r"FROM \('([^']+)'\) TO \('([^']+)'\)")

# Trajectories whose calls retention keeps (see the module docstring). Runs of the serving
# versions, of the candidates about to serve (waiting for review or for their canary) and of
# their ancestors, and runs still training; a trajectory is matched by its root id (calls move to
# the root trajectory when stitched).
_KEPT_TRAJECTORIES = """
WITH RECURSIVE lineage AS (
    SELECT v.id, v.parent_version_id, v.training_run_id FROM adapter_versions v
    WHERE v.status IN ('promoted', 'canary', 'candidate')
    UNION
    SELECT p.id, p.parent_version_id, p.training_run_id
    FROM adapter_versions p JOIN lineage l ON p.id = l.parent_version_id
), kept_runs AS (
    SELECT training_run_id AS id FROM lineage WHERE training_run_id IS NOT NULL
    UNION
    SELECT r.id FROM training_runs r WHERE r.status = 'running'
)
SELECT t.id FROM trajectories t WHERE t.trained_in_run_id IN (SELECT id FROM kept_runs)
UNION
SELECT t.id FROM trajectories t
WHERE t.trained_in_run_id IS NULL AND t.merged_into IS NULL AND t.trainable
  AND EXISTS (SELECT 1 FROM rewards r WHERE r.trajectory_id = t.id AND r.status = 'linked'
              AND r.superseded_at IS NULL)
"""

_ATTACHED = """
SELECT EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
               WHERE i.inhparent = 'calls'::regclass AND c.relname = %s)
"""


@dataclass(frozen=True)
class Partition:
    """One range partition of `calls`: rows with lower <= created_at < upper."""

    name: str
    lower: datetime
    upper: datetime


@dataclass
class MaintenanceReport:
    """What one maintenance pass did (logged, exported as metrics, printed by the CLI)."""

    created: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    rows_dropped: int = 0
    rows_kept: int = 0
    default_rows_deleted: int = 0
    moved_from_default: int = 0
    remnants: list[str] = field(default_factory=list)  # attached in place of a dropped partition
    remnant_rows_deleted: int = 0
    remnants_folded: list[str] = field(default_factory=list)
    skipped: str | None = None  # why the pass did nothing (another process, a lock timeout)

    def as_dict(self) -> dict[str, Any]:
        return {
            "created": self.created,
            "dropped": self.dropped,
            "rows_dropped": self.rows_dropped,
            "rows_kept": self.rows_kept,
            "default_rows_deleted": self.default_rows_deleted,
            "moved_from_default": self.moved_from_default,
            "remnants": self.remnants,
            "remnant_rows_deleted": self.remnant_rows_deleted,
            "remnants_folded": self.remnants_folded,
            "skipped": self.skipped,
        }


class AnotherMaintainer(Exception):
    """Another process holds the maintenance lock: this pass leaves the work to it."""


def interval_of(name: str) -> timedelta:
    return timedelta(days=7) if name == "week" else timedelta(days=1)


def partition_name(lower: datetime) -> str:
    """calls_pYYYYMMDD, with _HHMM when a bound is not at midnight (never the case by default)."""
    lower = lower.astimezone(timezone.utc)
    suffix = "" if (lower.hour, lower.minute) == (0, 0) else f"_{lower:%H%M}"
    return f"calls_p{lower:%Y%m%d}{suffix}"


def planned(
    existing: list[Partition], interval: timedelta, until: datetime, now: datetime
) -> list[tuple[datetime, datetime]]:
    """The ranges to create so that partitions reach `until`, each starting where the last ends.

    With no partition at all (a table made by hand), the first starts at today's midnight UTC.
    """
    if existing:
        lower = max(p.upper for p in existing)
    else:
        lower = now.astimezone(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    ranges = []
    while lower < until:
        ranges.append((lower, lower + interval))
        lower += interval
    return ranges


async def partitions(connection: psycopg.AsyncConnection[Any]) -> list[Partition]:
    """The range partitions of `calls`, oldest first (the DEFAULT partition is not listed).

    Read in a transaction of its own: left open, the maintenance transactions that follow would
    become savepoints of it (their locks and temporary tables would outlive them)."""
    async with connection.transaction(), connection.cursor() as cursor:
        await cursor.execute(_PARTITIONS)
        rows = await cursor.fetchall()
    found = []
    for name, bound in rows:
        match = _BOUND.search(bound)
        if match:
            found.append(
                Partition(name, datetime.fromisoformat(match.group(1)), datetime.fromisoformat(match.group(2)))
            )
    return sorted(found, key=lambda p: p.lower)


async def _locked(cursor: psycopg.AsyncCursor[Any], settings: HistorySettings) -> None:
    """Start a maintenance transaction: the one maintainer's lock, bounded waits for DDL locks."""
    await cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", (HISTORY_LOCK_ID,))
    row = await cursor.fetchone()
    if not row or not row[0]:
        raise AnotherMaintainer
    await cursor.execute(
        sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(f"{int(settings.lock_timeout_s * 1000)}ms"))
    )


async def _attached(cursor: psycopg.AsyncCursor[Any], name: str) -> bool:
    await cursor.execute(_ATTACHED, (name,))
    row = await cursor.fetchone()
    return bool(row and row[0])


def _excluded(name: str) -> sql.Identifier:
    """The CHECK on DEFAULT that excludes a range about to be attached (dropped once attached)."""
    return sql.Identifier(f"{name}_excluded")


async def _prepare(cursor: psycopg.AsyncCursor[Any], name: str, lower: datetime, upper: datetime) -> int:
    """First transaction of a creation: the new table on its own, DEFAULT's rows of its range
    moved into it, and a NOT VALID CHECK on DEFAULT that keeps further rows of the range out.

    Nothing here locks `calls` itself; DEFAULT is locked only for the (small) move and the
    catalog change. Idempotent: a creation interrupted between its two transactions is redone."""
    table = sql.Identifier(name)
    await cursor.execute(
        sql.SQL("CREATE TABLE IF NOT EXISTS {} (LIKE calls INCLUDING DEFAULTS INCLUDING CONSTRAINTS)").format(table)
    )
    # The table's own bound as a CHECK: ATTACH then skips scanning it (rows moved in are checked here).
    await cursor.execute(
        sql.SQL(
            "ALTER TABLE {} DROP CONSTRAINT IF EXISTS {}, "
            "ADD CONSTRAINT {} CHECK (created_at >= {} AND created_at < {})"
        ).format(
            table,
            sql.Identifier(f"{name}_bound"),
            sql.Identifier(f"{name}_bound"),
            sql.Literal(lower),
            sql.Literal(upper),
        )
    )
    await cursor.execute(
        sql.SQL(
            "WITH moved AS (DELETE FROM calls_default WHERE created_at >= {} AND created_at < {} RETURNING *) "
            "INSERT INTO {} SELECT * FROM moved"
        ).format(sql.Literal(lower), sql.Literal(upper), table)
    )
    moved = max(cursor.rowcount, 0)
    await cursor.execute(
        sql.SQL(
            "ALTER TABLE calls_default DROP CONSTRAINT IF EXISTS {}, "
            "ADD CONSTRAINT {} CHECK (created_at < {} OR created_at >= {}) NOT VALID"
        ).format(_excluded(name), _excluded(name), sql.Literal(lower), sql.Literal(upper))
    )
    return moved


async def _attach(cursor: psycopg.AsyncCursor[Any], name: str, lower: datetime, upper: datetime) -> None:
    """Second transaction of a creation: validate DEFAULT's CHECK (a scan under SHARE UPDATE
    EXCLUSIVE: reads and writes go on), then ATTACH, which takes SHARE UPDATE EXCLUSIVE on
    `calls` (the shipper's inserts go on) and, with the CHECKs proving both sides, scans nothing.
    The CHECKs are redundant with the partition bounds once attached and are dropped."""
    table = sql.Identifier(name)
    await cursor.execute(sql.SQL("ALTER TABLE calls_default VALIDATE CONSTRAINT {}").format(_excluded(name)))
    await cursor.execute(
        sql.SQL("ALTER TABLE calls ATTACH PARTITION {} FOR VALUES FROM ({}) TO ({})").format(
            table, sql.Literal(lower), sql.Literal(upper)
        )
    )
    await cursor.execute(sql.SQL("ALTER TABLE calls_default DROP CONSTRAINT {}").format(_excluded(name)))
    await cursor.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(table, sql.Identifier(f"{name}_bound")))


async def _abandon(connection: psycopg.AsyncConnection[Any], settings: HistorySettings, name: str) -> None:
    """Undo a prepared creation that cannot be attached (its range overlaps another partition):
    its rows go back to DEFAULT, DEFAULT's CHECK and the table go."""
    async with connection.transaction(), connection.cursor() as cursor:
        await _locked(cursor, settings)
        if await _attached(cursor, name):
            return
        await cursor.execute(sql.SQL("ALTER TABLE calls_default DROP CONSTRAINT IF EXISTS {}").format(_excluded(name)))
        await cursor.execute("SELECT to_regclass(%s) IS NOT NULL", (name,))
        row = await cursor.fetchone()
        if row and row[0]:
            await cursor.execute(sql.SQL("INSERT INTO calls SELECT * FROM {}").format(sql.Identifier(name)))
            await cursor.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(name)))


async def create_ahead(
    connection: psycopg.AsyncConnection[Any], settings: HistorySettings, now: datetime, report: MaintenanceReport
) -> None:
    """Create the partitions missing up to now + create_ahead_days, two transactions each.

    A range that overlaps an existing partition (gateways with different `partition_interval`
    during a rollout, each planning from its own listing) is abandoned and logged; the others'
    partitions cover it."""
    until = now + timedelta(days=settings.create_ahead_days)
    interval = interval_of(settings.partition_interval)
    for lower, upper in planned(await partitions(connection), interval, until, now):
        await create_partition(connection, settings, lower, upper, report)


async def create_partition(
    connection: psycopg.AsyncConnection[Any],
    settings: HistorySettings,
    lower: datetime,
    upper: datetime,
    report: MaintenanceReport,
) -> None:
    """Create and attach the partition [lower, upper), unless another process did."""
    name = partition_name(lower)
    async with connection.transaction(), connection.cursor() as cursor:
        await _locked(cursor, settings)
        # Another process may have made it between our listing and our lock.
        if await _attached(cursor, name):
            return
        moved = await _prepare(cursor, name, lower, upper)
    try:
        async with connection.transaction(), connection.cursor() as cursor:
            await _locked(cursor, settings)
            if await _attached(cursor, name):
                return
            await _attach(cursor, name, lower, upper)
    except psycopg.errors.InvalidObjectDefinition as exc:  # "would overlap partition"
        log.warning("history: partition %s [%s, %s) not created: %s", name, lower, upper, exc)
        await _abandon(connection, settings, name)
        return
    report.moved_from_default += moved
    report.created.append(name)
    log.info("history: created partition %s [%s, %s)", name, lower, upper)


# How long the drop waits at most for ACCESS EXCLUSIVE on `calls` at one try, and how many tries
# a pass makes. A lock request that waits makes every later request queue behind it (the
# shipper's inserts among them), so a try is short and retried rather than long.
DROP_LOCK_TRY_S = 0.5
DROP_LOCK_TRIES = 6
CHANGE_TRIGGER = "calls_retention_change"


def remnant_name(partition: str) -> str:
    """The table that holds a dropped partition's kept rows when there are more than SLICE_ROWS."""
    return f"{partition}{REMNANT_SUFFIX}"


async def _exists(cursor: psycopg.AsyncCursor[Any], name: str) -> bool:
    await cursor.execute("SELECT to_regclass(%s) IS NOT NULL", (name,))
    row = await cursor.fetchone()
    return bool(row and row[0])


async def _watch_and_copy(
    connection: psycopg.AsyncConnection[Any], settings: HistorySettings, partition: Partition
) -> int | None:
    """The first steps of a drop, none locking `calls` (the shipper goes on):

    1. a trigger on the partition records every later write to it (calls_retention_changes);
       creating it waits for writers of this partition only, never for the shipper's inserts
       of today's calls;
    2. the kept rows are copied into the remnant table `<partition>_kept` (made LIKE calls with
       its indexes, not attached; the trajectories kept at the copy into the session's temporary
       `retained_trajectories`) from a snapshot taken after the trigger exists, so a row is
       either in the copy or written later and recorded; a CHECK of the partition's bounds on the
       remnant lets a later ATTACH skip scanning it;
    3. a CHECK on DEFAULT that excludes the range (always true while the partition covers it),
       validated under SHARE UPDATE EXCLUSIVE, lets that ATTACH skip scanning DEFAULT.

    A remnant table left unattached by an interrupted pass is made anew. Returns the partition's
    row count at the copy; None when the partition is gone already."""
    name = sql.Identifier(partition.name)
    remnant = sql.Identifier(remnant_name(partition.name))
    async with connection.transaction(), connection.cursor() as cursor:
        await _locked(cursor, settings)
        if not await _attached(cursor, partition.name):
            return None
        await cursor.execute(
            sql.SQL(
                "CREATE OR REPLACE TRIGGER {} AFTER INSERT OR UPDATE OR DELETE ON {} "
                "FOR EACH ROW EXECUTE FUNCTION calls_retention_change()"
            ).format(sql.Identifier(CHANGE_TRIGGER), name)
        )
        await cursor.execute("DELETE FROM calls_retention_changes WHERE partition = %s", (partition.name,))
    async with connection.transaction(), connection.cursor() as cursor:
        await cursor.execute("SET LOCAL jit = off")
        await cursor.execute("DROP TABLE IF EXISTS retained_trajectories")
        # While the partition is attached, its remnant cannot be: a table of that name is an
        # interrupted pass's copy.
        await cursor.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(remnant))
        await cursor.execute(f"CREATE TEMP TABLE retained_trajectories AS {_KEPT_TRAJECTORIES}")
        await cursor.execute("ALTER TABLE retained_trajectories ADD PRIMARY KEY (id)")
        await cursor.execute(sql.SQL("CREATE TABLE {} (LIKE calls INCLUDING ALL)").format(remnant))
        await cursor.execute(
            sql.SQL(
                "INSERT INTO {} SELECT c.* FROM {} c WHERE c.trajectory_id IN (SELECT id FROM retained_trajectories)"
            ).format(remnant, name)
        )
        await cursor.execute(
            sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} CHECK (created_at >= {} AND created_at < {})").format(
                remnant,
                sql.Identifier(f"{remnant_name(partition.name)}_bound"),
                sql.Literal(partition.lower),
                sql.Literal(partition.upper),
            )
        )
        await cursor.execute(sql.SQL("SELECT count(*) FROM {}").format(name))
        row = await cursor.fetchone()
    async with connection.transaction(), connection.cursor() as cursor:
        await _locked(cursor, settings)
        await cursor.execute(
            sql.SQL(
                "ALTER TABLE calls_default DROP CONSTRAINT IF EXISTS {}, "
                "ADD CONSTRAINT {} CHECK (created_at < {} OR created_at >= {}) NOT VALID"
            ).format(
                _excluded(partition.name),
                _excluded(partition.name),
                sql.Literal(partition.lower),
                sql.Literal(partition.upper),
            )
        )
    async with connection.transaction(), connection.cursor() as cursor:
        await _locked(cursor, settings)
        await cursor.execute(
            sql.SQL("ALTER TABLE calls_default VALIDATE CONSTRAINT {}").format(_excluded(partition.name))
        )
    return int(row[0]) if row else 0


async def _swap_out(
    cursor: psycopg.AsyncCursor[Any], partition: Partition, copied_total: int
) -> tuple[int, int, str | None]:
    """The last step of a drop, under ACCESS EXCLUSIVE on `calls` (taken by the caller): bring
    the remnant up to date (rows written since the copy, trajectories kept or no longer kept since
    it, each found by index), detach the partition and drop it, and put the kept rows back: at
    most SLICE_ROWS into `calls` (they land in DEFAULT), more by attaching the remnant for the
    partition's range. Returns (rows dropped, rows kept, the remnant's name when attached)."""
    name = sql.Identifier(partition.name)
    remnant_table = remnant_name(partition.name)
    remnant = sql.Identifier(remnant_table)
    await cursor.execute("CREATE TEMP TABLE IF NOT EXISTS kept_trajectories (id uuid PRIMARY KEY) ON COMMIT DROP")
    await cursor.execute(f"INSERT INTO kept_trajectories {_KEPT_TRAJECTORIES} ON CONFLICT DO NOTHING")
    await cursor.execute(
        "CREATE TEMP TABLE changed_calls ON COMMIT DROP AS SELECT DISTINCT call_id AS id "
        "FROM calls_retention_changes WHERE partition = %s",
        (partition.name,),
    )
    await cursor.execute(
        "SELECT count(*) FILTER (WHERE operation = 'INSERT') - count(*) FILTER (WHERE operation = 'DELETE') "
        "FROM calls_retention_changes WHERE partition = %s",
        (partition.name,),
    )
    row = await cursor.fetchone()
    total = copied_total + int(row[0] if row and row[0] is not None else 0)
    # Forget what changed since the copy, and what is no longer kept...
    await cursor.execute(sql.SQL("DELETE FROM {} r USING changed_calls ch WHERE ch.id = r.id").format(remnant))
    await cursor.execute(
        sql.SQL(
            "DELETE FROM {} r WHERE NOT EXISTS (SELECT 1 FROM kept_trajectories k WHERE k.id = r.trajectory_id)"
        ).format(remnant)
    )
    # ...then read the changed rows as they are now, and the rows of newly kept trajectories.
    await cursor.execute(
        sql.SQL(
            "INSERT INTO {} SELECT c.* FROM {} c JOIN changed_calls ch ON ch.id = c.id "
            "WHERE c.trajectory_id IN (SELECT id FROM kept_trajectories)"
        ).format(remnant, name)
    )
    await cursor.execute(
        sql.SQL(
            "INSERT INTO {} SELECT c.* FROM {} c "
            "WHERE c.trajectory_id IN (SELECT id FROM kept_trajectories EXCEPT SELECT id FROM retained_trajectories) "
            "AND NOT EXISTS (SELECT 1 FROM {} r WHERE r.id = c.id)"
        ).format(remnant, name, remnant)
    )
    await cursor.execute(sql.SQL("SELECT count(*) FROM {}").format(remnant))
    row = await cursor.fetchone()
    kept = int(row[0]) if row else 0
    await cursor.execute(sql.SQL("ALTER TABLE calls DETACH PARTITION {}").format(name))
    await cursor.execute(sql.SQL("DROP TABLE {}").format(name))
    attached: str | None = None
    if kept <= SLICE_ROWS:
        await cursor.execute(sql.SQL("ALTER TABLE calls_default DROP CONSTRAINT {}").format(_excluded(partition.name)))
        await cursor.execute(sql.SQL("INSERT INTO calls SELECT * FROM {}").format(remnant))
        await cursor.execute(sql.SQL("DROP TABLE {}").format(remnant))
    else:
        # Both CHECKs prove the bounds: the ATTACH scans neither the remnant nor DEFAULT.
        await cursor.execute(
            sql.SQL("ALTER TABLE calls ATTACH PARTITION {} FOR VALUES FROM ({}) TO ({})").format(
                remnant, sql.Literal(partition.lower), sql.Literal(partition.upper)
            )
        )
        await cursor.execute(sql.SQL("ALTER TABLE calls_default DROP CONSTRAINT {}").format(_excluded(partition.name)))
        await cursor.execute(
            sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(remnant, sql.Identifier(f"{remnant_table}_bound"))
        )
        attached = remnant_table
    await cursor.execute("DELETE FROM calls_retention_changes WHERE partition = %s", (partition.name,))
    return total - kept, kept, attached


async def _under_calls_lock(
    connection: psycopg.AsyncConnection[Any],
    settings: HistorySettings,
    still_there: str,
    step: Callable[[psycopg.AsyncCursor[Any]], Awaitable[_T]],
) -> _T | None:
    """Run `step` in a transaction holding ACCESS EXCLUSIVE on `calls` (and so on its partitions).

    `calls` is locked first, then its partitions (LOCK TABLE recurses in that order): the order
    of an UPDATE of calls without a time bound (the stitcher, a deletion), so the two never wait
    on each other in a cycle. The lock is tried for DROP_LOCK_TRY_S at a time, since a waiting
    request queues the shipper's inserts behind it. None when the partition `still_there` is no
    longer attached once the lock is held (another process got to it first)."""
    try_ms = int(min(settings.lock_timeout_s, DROP_LOCK_TRY_S) * 1000)
    for attempt in range(1, DROP_LOCK_TRIES + 1):
        try:
            async with connection.transaction(), connection.cursor() as cursor:
                await _locked(cursor, settings)
                await cursor.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(f"{try_ms}ms")))
                await cursor.execute("LOCK TABLE calls IN ACCESS EXCLUSIVE MODE")
                await cursor.execute("SET LOCAL jit = off")
                if not await _attached(cursor, still_there):
                    return None
                return await step(cursor)
        except psycopg.errors.LockNotAvailable:
            if attempt == DROP_LOCK_TRIES:
                raise
            await asyncio.sleep(DROP_LOCK_TRY_S * attempt)
    raise AssertionError("unreachable")


@contextlib.asynccontextmanager
async def _session_lock(connection: psycopg.AsyncConnection[Any]) -> AsyncIterator[None]:
    """The maintenance lock held across several transactions (a session advisory lock)."""
    async with connection.transaction(), connection.cursor() as cursor:  # a transaction: none is left open
        await cursor.execute("SELECT pg_try_advisory_lock(%s)", (HISTORY_LOCK_ID,))
        row = await cursor.fetchone()
    if not row or not row[0]:
        raise AnotherMaintainer
    try:
        yield
    finally:
        with contextlib.suppress(psycopg.Error):
            async with connection.transaction(), connection.cursor() as cursor:
                await cursor.execute("SELECT pg_advisory_unlock(%s)", (HISTORY_LOCK_ID,))


async def _drop(
    connection: psycopg.AsyncConnection[Any], settings: HistorySettings, partition: Partition
) -> tuple[int, int, str | None] | None:
    """Detach and drop one partition, its kept rows put back into `calls` (DEFAULT or a remnant).

    The copy (seconds for a day's partition) is made before the strong lock; ACCESS EXCLUSIVE on
    `calls` is held only to apply the writes made since, by key, and to swap the partition out.
    The session's advisory lock keeps another maintainer off the partition between the steps.
    Returns (rows dropped, rows kept, remnant attached or None); None when another process
    dropped it first."""
    async with _session_lock(connection):
        try:
            copied_total = await _watch_and_copy(connection, settings, partition)
            if copied_total is None:
                return None
            return await _under_calls_lock(
                connection,
                settings,
                partition.name,
                lambda cursor: _swap_out(cursor, partition, copied_total),
            )
        finally:
            # An unattached remnant and DEFAULT's CHECK are left only by a pass that stopped
            # before its swap: the partition is still there, and the next pass makes them anew.
            with contextlib.suppress(psycopg.Error):
                async with connection.transaction(), connection.cursor() as cursor:
                    await cursor.execute("DROP TABLE IF EXISTS retained_trajectories")
                    if not await _attached(cursor, remnant_name(partition.name)):
                        await cursor.execute(
                            sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(remnant_name(partition.name)))
                        )


async def _kept_now(cursor: psycopg.AsyncCursor[Any]) -> None:
    """Fill the transaction's temporary `kept_trajectories` with what retention keeps now."""
    await cursor.execute("CREATE TEMP TABLE IF NOT EXISTS kept_trajectories (id uuid PRIMARY KEY) ON COMMIT DROP")
    await cursor.execute("TRUNCATE kept_trajectories")
    await cursor.execute(f"INSERT INTO kept_trajectories {_KEPT_TRAJECTORIES} ON CONFLICT DO NOTHING")


async def _purge_default(cursor: psycopg.AsyncCursor[Any], cutoff: datetime) -> int:
    """Delete DEFAULT's rows older than the cutoff that nothing needs any more."""
    await _kept_now(cursor)
    await cursor.execute(
        "DELETE FROM calls_default d WHERE d.created_at < %s "
        "AND NOT EXISTS (SELECT 1 FROM kept_trajectories k WHERE k.id = d.trajectory_id)",
        (cutoff,),
    )
    return cursor.rowcount


async def _fold_into_default(cursor: psycopg.AsyncCursor[Any], remnant: str) -> int:
    """Under the lock on `calls`: detach a remnant of at most SLICE_ROWS rows, put them into
    DEFAULT (no range covers them any more) and drop it. Returns the rows moved."""
    table = sql.Identifier(remnant)
    await cursor.execute(sql.SQL("ALTER TABLE calls DETACH PARTITION {}").format(table))
    await cursor.execute(sql.SQL("INSERT INTO calls SELECT * FROM {}").format(table))
    moved = max(cursor.rowcount, 0)
    await cursor.execute(sql.SQL("DROP TABLE {}").format(table))
    return moved


async def _shrink_remnant(
    connection: psycopg.AsyncConnection[Any], settings: HistorySettings, remnant: Partition, report: MaintenanceReport
) -> None:
    """Delete a remnant's rows that nothing needs any more (row by row: no lock on `calls`), and
    fold it into DEFAULT once it holds at most SLICE_ROWS."""
    async with connection.transaction(), connection.cursor() as cursor:
        await _locked(cursor, settings)
        if not await _attached(cursor, remnant.name):
            return
        await _kept_now(cursor)
        await cursor.execute(
            sql.SQL(
                "DELETE FROM {} r WHERE NOT EXISTS (SELECT 1 FROM kept_trajectories k WHERE k.id = r.trajectory_id)"
            ).format(sql.Identifier(remnant.name))
        )
        report.remnant_rows_deleted += max(cursor.rowcount, 0)
        await cursor.execute(
            sql.SQL("SELECT count(*) > {} FROM {}").format(sql.Literal(SLICE_ROWS), sql.Identifier(remnant.name))
        )
        row = await cursor.fetchone()
    if row and row[0]:
        return
    async with _session_lock(connection):
        moved = await _under_calls_lock(
            connection, settings, remnant.name, lambda cursor: _fold_into_default(cursor, remnant.name)
        )
    if moved is not None:
        report.remnants_folded.append(remnant.name)
        log.info("history: remnant %s folded into %s (%d kept calls)", remnant.name, DEFAULT_PARTITION, moved)


async def apply_retention(
    connection: psycopg.AsyncConnection[Any], settings: HistorySettings, now: datetime, report: MaintenanceReport
) -> None:
    """Drop every partition wholly older than retention_days (kept rows move to DEFAULT or stay
    in a remnant), then delete what nothing needs any more from the remnants and DEFAULT."""
    if settings.retention_days is None:
        return
    cutoff = now - timedelta(days=settings.retention_days)
    for partition in await partitions(connection):
        if partition.upper > cutoff:
            break
        if not _NAME.match(partition.name):
            continue  # a remnant (below), or a partition an operator made by hand: left to the operator
        outcome = await _drop(connection, settings, partition)
        if outcome is None:
            continue  # dropped by another process since our listing
        dropped, kept, remnant = outcome
        report.dropped.append(partition.name)
        report.rows_dropped += dropped
        report.rows_kept += kept
        if remnant:
            report.remnants.append(remnant)
        log.info(
            "history: dropped partition %s [%s, %s): %d calls dropped, %d kept (untrained or serving lineage) in %s",
            partition.name,
            partition.lower,
            partition.upper,
            dropped,
            kept,
            remnant or DEFAULT_PARTITION,
        )
    for partition in await partitions(connection):
        if _REMNANT.match(partition.name) and partition.upper <= cutoff:
            await _shrink_remnant(connection, settings, partition, report)
    async with connection.transaction():
        async with connection.cursor() as cursor:
            await _locked(cursor, settings)
            report.default_rows_deleted = await _purge_default(cursor, cutoff)
    if report.default_rows_deleted:
        log.info(
            "history: deleted %d calls older than retention from %s", report.default_rows_deleted, DEFAULT_PARTITION
        )


async def maintain(
    connection: psycopg.AsyncConnection[Any], settings: HistorySettings, now: datetime | None = None
) -> MaintenanceReport:
    """One pass: create partitions ahead, then apply retention. Safe to run from many processes.

    A pass another process is already running, or whose DDL could not get its lock in time, ends
    early with `skipped` set; the next pass picks up where it stopped.
    """
    now = now or datetime.now(timezone.utc)
    report = MaintenanceReport()
    try:
        await create_ahead(connection, settings, now, report)
        await apply_retention(connection, settings, now, report)
    except AnotherMaintainer:
        report.skipped = "another process is maintaining the partitions"
    except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected) as exc:
        # A lock not had in time, or a cycle with a writer that PostgreSQL broke by cancelling
        # this transaction: nothing was half done (one transaction per step); the next pass retries.
        report.skipped = f"lock not available: {exc.diag.message_primary}"
        log.warning("history: maintenance stopped early, tried again next pass (%s)", report.skipped)
    return report
