"""Partition maintenance against live writers (apprentice/store/history.py, docs/history.md):
retention and an UPDATE of calls without a time bound (the stitcher's, a deletion's) wait on
each other in either order and never deadlock; creation attaches its table while the shipper's
transaction is open and without scanning DEFAULT; a range that overlaps a partition made with
another interval is skipped; candidates and running trainings keep their data.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

import psycopg

from apprentice.settings import HistorySettings
from apprentice.store import history
from tests.test_history_partitions import (
    NOW,
    TODAY,
    insert_call,
    insert_trajectory,
    maintain,
    old_partition,
    range_partitions,
    reward,
    version,
    where,
)

# Long enough that every wait below ends by the other side finishing, not by the timeout.
PATIENT = HistorySettings(retention_days=30, lock_timeout_s=20)

# The stitcher's settle pass: an UPDATE of calls with no bound on created_at (every partition).
_UNBOUNDED_UPDATE = "UPDATE calls SET stitch_pending = false WHERE trajectory_id = %s"


class Background(threading.Thread):
    """Runs a function in a thread and keeps its result or its exception for the test."""

    def __init__(self, work: Any) -> None:
        super().__init__(daemon=True)
        self.work = work
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.work()
        except BaseException as exc:  # noqa: BLE001 - the test asserts on it
            self.error = exc


def _waiting(db: psycopg.Connection, pid: int, timeout_s: float = 10.0) -> None:
    """Until the backend `pid` waits on a lock (the interleaving the test needs is reached)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        row = db.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
        if row and row[0] == "Lock":
            return
        time.sleep(0.05)
    raise AssertionError(f"backend {pid} never waited on a lock")


def _retention_pid(db: psycopg.Connection, *others: int) -> int:
    """The backend of the retention pass: the one of this database, not ours, waiting on a lock."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        row = db.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' "
            "AND pid <> pg_backend_pid() AND NOT pid = ANY(%s)",
            (list(others),),
        ).fetchone()
        if row:
            return int(row[0])
        time.sleep(0.05)
    raise AssertionError("the retention pass never waited")


def _setup(db: psycopg.Connection) -> tuple[str, uuid.UUID, uuid.UUID, uuid.UUID]:
    """An old partition with a kept (promoted lineage) and a dropped trajectory, and a recent one."""
    old = TODAY - timedelta(days=60)
    name = old_partition(db, old)
    _, run = version(db, 1, "promoted", None)
    kept = insert_trajectory(db, old + timedelta(hours=2), run=run)
    dropped = insert_trajectory(db, old + timedelta(hours=3))
    recent = insert_trajectory(db, NOW - timedelta(hours=1))
    return name, kept, dropped, recent


def test_an_unbounded_update_during_retentions_copy_goes_through_at_once_without_deadlock(
    database_url: str, db: psycopg.Connection
) -> None:
    """Retention copies the kept rows before it locks `calls`: a writer that needs every
    partition (the stitcher's UPDATE) does not wait for the copy, and its write is kept."""
    name, kept, dropped, recent = _setup(db)
    with psycopg.connect(database_url) as holder, psycopg.connect(database_url) as writer:
        # Holding trajectories stops the retention pass in its copy (it reads the kept set).
        holder.execute("LOCK TABLE trajectories IN ACCESS EXCLUSIVE MODE")
        retention = Background(lambda: maintain(database_url, PATIENT))
        retention.start()
        _retention_pid(db)
        started = time.monotonic()
        assert writer.execute(_UNBOUNDED_UPDATE, (recent,)).rowcount == 2
        assert writer.execute(_UNBOUNDED_UPDATE, (kept,)).rowcount == 2  # the old partition's rows too
        writer.commit()
        assert time.monotonic() - started < 1.0
        holder.commit()
        retention.join(30)
    assert retention.error is None, retention.error
    report = retention.result
    assert report.skipped is None and report.dropped == [name], report
    assert where(db, kept) == ["calls_default", "calls_default"]
    assert where(db, dropped) == []
    assert len(where(db, recent)) == 2


def test_an_unbounded_update_then_retention_wait_on_each_other_without_deadlock(
    database_url: str, db: psycopg.Connection
) -> None:
    name, kept, dropped, recent = _setup(db)
    with psycopg.connect(database_url) as writer:
        assert writer.execute(_UNBOUNDED_UPDATE, (recent,)).rowcount == 2  # holds calls and every partition
        retention = Background(lambda: maintain(database_url, PATIENT))
        retention.start()
        _retention_pid(db, writer.info.backend_pid)
        # The same transaction writes again, to the old partition's rows this time.
        assert writer.execute(_UNBOUNDED_UPDATE, (kept,)).rowcount == 2
        writer.commit()
        retention.join(30)
    assert retention.error is None, retention.error
    assert retention.result.skipped is None and retention.result.dropped == [name], retention.result
    assert where(db, kept) == ["calls_default", "calls_default"]
    assert db.execute("SELECT count(*) FROM calls WHERE trajectory_id = %s AND stitch_pending", (kept,)).fetchone() == (
        0,
    )


def test_a_pass_that_cannot_lock_in_time_is_skipped_and_redone(database_url: str, db: psycopg.Connection) -> None:
    name, kept, _, _ = _setup(db)
    with psycopg.connect(database_url) as writer:
        writer.execute(_UNBOUNDED_UPDATE, (kept,))
        report = maintain(database_url, HistorySettings(retention_days=30, lock_timeout_s=0.2))
        assert report.skipped and "lock" in report.skipped and report.dropped == [], report
    assert maintain(database_url, PATIENT).dropped == [name]
    assert where(db, kept) == ["calls_default", "calls_default"]


def test_creation_attaches_beside_an_open_insert_and_does_not_scan_default(
    database_url: str, db: psycopg.Connection
) -> None:
    # Kept rows in DEFAULT, as retention leaves them, and a stray from a clock far ahead.
    kept = uuid.uuid4()
    insert_call(db, kept, TODAY - timedelta(days=200))
    stray = uuid.uuid4()
    far = TODAY + timedelta(days=9, hours=5)
    insert_call(db, stray, far)
    assert where(db, kept) == ["calls_default"] and where(db, stray) == ["calls_default"]
    notices: list[str] = []

    async def run() -> history.MaintenanceReport:
        async with await psycopg.AsyncConnection.connect(database_url) as connection:
            connection.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
            await connection.execute("SET client_min_messages = debug1")
            await connection.commit()
            return await history.maintain(connection, HistorySettings(create_ahead_days=10, lock_timeout_s=2), NOW)

    with psycopg.connect(database_url) as shipper:
        # A shipper's insert transaction still open: it holds ROW EXCLUSIVE on calls.
        insert_call(shipper, uuid.uuid4(), NOW)
        report = asyncio.run(run())
        shipper.commit()
    assert report.skipped is None, report
    assert history.partition_name(TODAY + timedelta(days=9)) in report.created
    assert report.moved_from_default == 1
    assert where(db, stray) == [history.partition_name(TODAY + timedelta(days=9))]
    assert where(db, kept) == ["calls_default"]
    assert any('default partition "calls_default" is implied by existing constraints' in n for n in notices), notices
    # ATTACH scanned neither side (DEFAULT was read by VALIDATE CONSTRAINT before, under SHARE
    # UPDATE EXCLUSIVE, which lets reads and writes of DEFAULT go on).
    new = history.partition_name(TODAY + timedelta(days=9))
    assert any(f'partition constraint for table "{new}" is implied' in n for n in notices), notices
    # The helper CHECKs are gone once attached: DEFAULT takes any row again.
    checks = db.execute(
        "SELECT conname FROM pg_constraint WHERE contype = 'c' "
        "AND conrelid IN ('calls_default'::regclass, %s::regclass)",
        (history.partition_name(TODAY + timedelta(days=9)),),
    ).fetchall()
    assert checks == []


def test_a_range_overlapping_another_interval_partition_is_skipped_and_cleaned(
    database_url: str, db: psycopg.Connection
) -> None:
    last = max(upper for _, upper in [(p.lower, p.upper) for p in _listing(database_url)])
    # A gateway with weekly partitions made [last, last + 7 days) ...
    weekly = history.partition_name(last)
    db.execute(
        f"CREATE TABLE {weekly} PARTITION OF calls FOR VALUES FROM ('{last.isoformat()}') "
        f"TO ('{(last + timedelta(days=7)).isoformat()}')"
    )
    # ... while one with daily partitions, from its older listing, creates [last + 1 day, + 2 days).
    lower = last + timedelta(days=1)
    report = history.MaintenanceReport()

    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(database_url) as connection:
            await history.create_partition(connection, HistorySettings(), lower, lower + timedelta(days=1), report)

    asyncio.run(run())
    assert report.created == []
    name = history.partition_name(lower)
    assert db.execute("SELECT to_regclass(%s)", (name,)).fetchone() == (None,)
    assert db.execute(
        "SELECT count(*) FROM pg_constraint WHERE conrelid = 'calls_default'::regclass AND contype = 'c'"
    ).fetchone() == (0,)
    insert_call(db, uuid.uuid4(), lower + timedelta(hours=1))  # lands in the weekly partition
    assert (weekly, f"FOR VALUES FROM ('{_pg(db, last)}') TO ('{_pg(db, last + timedelta(days=7))}')") in (
        range_partitions(db)
    )


def _pg(db: psycopg.Connection, moment: datetime) -> str:
    row = db.execute("SELECT %s::timestamptz::text", (moment,)).fetchone()
    assert row is not None
    return str(row[0])


def _listing(url: str) -> list[history.Partition]:
    async def run() -> list[history.Partition]:
        async with await psycopg.AsyncConnection.connect(url) as connection:
            return await history.partitions(connection)

    return asyncio.run(run())


def test_retention_keeps_the_data_of_candidates_and_of_running_trainings(
    database_url: str, db: psycopg.Connection
) -> None:
    old = TODAY - timedelta(days=60)
    name = old_partition(db, old)
    promoted, _ = version(db, 1, "promoted", None)
    candidate_parent, parent_run = version(db, 2, "retired", promoted)
    _, candidate_run = version(db, 3, "candidate", candidate_parent)
    running = uuid.uuid4()
    db.execute("INSERT INTO training_runs (id, policy, status) VALUES (%s, 'p', 'running')", (running,))
    failed = uuid.uuid4()
    db.execute("INSERT INTO training_runs (id, policy, status) VALUES (%s, 'p', 'failed')", (failed,))
    at = old + timedelta(hours=4)
    of_candidate = insert_trajectory(db, at, run=candidate_run)
    of_candidate_parent = insert_trajectory(db, at, run=parent_run)
    in_training = insert_trajectory(db, at, run=running)
    reward(db, in_training)
    of_failed = insert_trajectory(db, at, run=failed)

    report = maintain(database_url, HistorySettings(retention_days=30))

    assert report.dropped == [name] and (report.rows_kept, report.rows_dropped) == (6, 2), report
    for kept in (of_candidate, of_candidate_parent, in_training):
        assert where(db, kept) == ["calls_default", "calls_default"]
    assert where(db, of_failed) == []
    # The run ends and its version is rejected: the next pass lets its data go.
    db.execute("UPDATE training_runs SET status = 'failed' WHERE id = %s", (running,))
    db.execute("UPDATE adapter_versions SET status = 'rejected' WHERE training_run_id = %s", (candidate_run,))
    assert maintain(database_url, HistorySettings(retention_days=30)).default_rows_deleted == 6
