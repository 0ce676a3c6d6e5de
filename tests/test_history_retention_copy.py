"""Retention copies a partition's kept rows before it locks `calls` (apprentice/store/history.py):
what is written to the partition between the copy and the swap is applied; many kept rows stay in
a remnant attached for the partition's range, few go to DEFAULT, and a remnant that shrinks is
folded into DEFAULT; the shipper's inserts wait neither for the copy nor for the kept rows
(measured on a partition of real size for this machine, half of its calls kept)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import timedelta
from typing import Any

import psycopg

from apprentice.settings import HistorySettings
from apprentice.store import history
from gateway.store.calls import insert_call_lines
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

SETTINGS = HistorySettings(retention_days=30, lock_timeout_s=5)
# The measured partition: its calls, and one trajectory in KEPT_EVERY kept. Half of a day kept is
# what a policy that trains on all its traffic keeps (its serving lineage's data); before
# remnants, putting them back into `calls` held the lock for seconds.
CALLS = 200_000
KEPT_EVERY = 2


def kept_rows(db: psycopg.Connection) -> dict[uuid.UUID, tuple[uuid.UUID, float | None]]:
    """DEFAULT's rows: call id -> (trajectory, latency_ms)."""
    rows = db.execute("SELECT id, trajectory_id, latency_ms FROM calls_default").fetchall()
    return {row[0]: (row[1], row[2]) for row in rows}


def test_writes_between_the_copy_and_the_swap_are_applied(database_url: str, db: psycopg.Connection) -> None:
    old = TODAY - timedelta(days=60)
    name = old_partition(db, old)
    _, run = version(db, 1, "promoted", None)
    kept = insert_trajectory(db, old + timedelta(hours=1), run=run)
    unkept = insert_trajectory(db, old + timedelta(hours=2))
    later_kept = insert_trajectory(db, old + timedelta(hours=3))
    db.execute("UPDATE trajectories SET trained_in_run_id = NULL, trainable = true WHERE id = %s", (later_kept,))
    kept_calls = [
        r[0] for r in db.execute("SELECT id FROM calls WHERE trajectory_id = %s ORDER BY created_at", (kept,))
    ]
    moved = db.execute("SELECT id FROM calls WHERE trajectory_id = %s LIMIT 1", (unkept,)).fetchone()[0]
    partition = next(p for p in asyncio.run(_partitions(database_url)) if p.name == name)

    async def drop_with_writes_in_between() -> tuple[int, int]:
        async with await psycopg.AsyncConnection.connect(database_url) as connection:
            copied = await history._watch_and_copy(connection, SETTINGS, partition)
            assert copied == 6
            # Written by others after the copy, before the lock:
            db.execute("UPDATE calls SET latency_ms = 777 WHERE id = %s", (kept_calls[0],))  # changed
            db.execute("DELETE FROM calls WHERE id = %s", (kept_calls[1],))  # deleted
            late = insert_call(db, kept, old + timedelta(hours=5))  # a late journal line
            db.execute("UPDATE calls SET trajectory_id = %s WHERE id = %s", (kept, moved))  # stitched into kept
            reward(db, later_kept)  # now rewarded and untrained: kept
            drop_with_writes_in_between.late = late  # type: ignore[attr-defined]
            async with connection.transaction(), connection.cursor() as cursor:
                await cursor.execute("LOCK TABLE calls IN ACCESS EXCLUSIVE MODE")
                return await history._swap_out(cursor, partition, copied)

    dropped, kept_count, remnant = asyncio.run(drop_with_writes_in_between())
    late = drop_with_writes_in_between.late  # type: ignore[attr-defined]
    rows = kept_rows(db)
    assert rows[kept_calls[0]] == (kept, 777.0)
    assert kept_calls[1] not in rows
    assert rows[late][0] == kept and rows[moved][0] == kept
    assert {call for call, (trajectory, _) in rows.items() if trajectory == later_kept} and len(rows) == 5
    assert (dropped, kept_count) == (1, 5)  # 6 copied + 1 late - 1 deleted = 6 rows, 5 kept
    assert remnant is None  # 5 kept rows went to DEFAULT; the remnant table is gone
    assert db.execute("SELECT to_regclass(%s)", (name,)).fetchone() == (None,)
    assert db.execute("SELECT to_regclass(%s)", (history.remnant_name(name),)).fetchone() == (None,)
    assert db.execute("SELECT count(*) FROM calls_retention_changes").fetchone() == (0,)


async def _partitions(url: str) -> list[history.Partition]:
    async with await psycopg.AsyncConnection.connect(url) as connection:
        return await history.partitions(connection)


def _fill(db: psycopg.Connection, lower: Any, calls: int, kept_every: int, run: uuid.UUID) -> None:
    """`calls` calls of 5-call trajectories in the partition of `lower`, every `kept_every`-th
    trajectory trained by the promoted version's run (kept), with requests of real size."""
    request = json.dumps({"messages": [{"role": "user", "content": "x" * 600}, {"role": "assistant", "content": "y"}]})
    db.execute(
        """
        WITH t AS (
            INSERT INTO trajectories (id, tenant, model, policy, first_call_at, last_call_at, call_count,
                                      trained_in_run_id)
            SELECT gen_random_uuid(), 't', 'm', 'p', %(lower)s + make_interval(secs => g * 2.0),
                   %(lower)s + make_interval(secs => g * 2.0), 5,
                   CASE WHEN g %% %(kept_every)s = 0 THEN %(run)s::uuid END
            FROM generate_series(1, %(trajectories)s) g
            RETURNING id, first_call_at
        )
        INSERT INTO calls (id, trajectory_id, tenant, model, policy, created_at, status_code, request, response)
        SELECT gen_random_uuid(), t.id, 't', 'm', 'p', t.first_call_at + make_interval(secs => k), 200,
               %(request)s::jsonb, %(request)s::jsonb
        FROM t, generate_series(0, 4) k
        """,
        {"lower": lower, "kept_every": kept_every, "run": run, "trajectories": calls // 5, "request": request},
    )


def test_the_shipper_waits_under_a_second_while_a_sizeable_partition_is_dropped(
    database_url: str, db: psycopg.Connection
) -> None:
    """200,000 calls in the old partition, half of them kept; the shipper's path
    (insert_call_lines) stores a batch every 20 ms throughout the pass. The kept rows stay in a
    remnant attached in the partition's place, so the lock is held for catalog work only."""
    old = TODAY - timedelta(days=60)
    name = old_partition(db, old)
    _, run = version(db, 1, "promoted", None)
    _fill(db, old, CALLS, KEPT_EVERY, run)
    db.execute("ANALYZE")

    async def run_pass() -> tuple[history.MaintenanceReport, list[float], float]:
        from sqlalchemy.ext.asyncio import create_async_engine

        engine = create_async_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))
        waits: list[float] = []
        done = asyncio.Event()

        async def ship() -> None:
            trajectory = uuid.uuid4()
            while not done.is_set():
                line = {
                    "id": str(uuid.uuid4()),
                    "trajectory_id": str(trajectory),
                    "tenant": "t",
                    "model": "m",
                    "created_at": time.time(),
                    "status_code": 200,
                    "request": {"messages": []},
                }
                started = time.monotonic()
                await insert_call_lines(engine, [json.dumps(line).encode()])
                waits.append(time.monotonic() - started)
                await asyncio.sleep(0.02)

        shipper = asyncio.create_task(ship())
        await asyncio.sleep(0.5)
        started = time.monotonic()
        async with await psycopg.AsyncConnection.connect(database_url) as connection:
            report = await history.maintain(connection, SETTINGS, NOW)
        elapsed = time.monotonic() - started
        done.set()
        await shipper
        await engine.dispose()
        return report, waits, elapsed

    report, waits, elapsed = asyncio.run(run_pass())
    print(
        f"retention pass {elapsed:.2f} s, {report.rows_dropped} dropped, {report.rows_kept} kept; "
        f"shipper batches {len(waits)}, longest {max(waits) * 1000:.0f} ms"
    )
    assert (
        report.dropped == [name]
        and report.rows_kept == CALLS // KEPT_EVERY
        and report.rows_dropped == CALLS - CALLS // KEPT_EVERY
        and report.remnants == [history.remnant_name(name)]
    ), report
    remnant = history.remnant_name(name)
    assert db.execute(f"SELECT count(*) FROM {remnant}").fetchone() == (CALLS // KEPT_EVERY,)
    attached = next(p for p in asyncio.run(_partitions(database_url)) if p.name == remnant)
    assert (attached.lower, attached.upper) == (old, old + timedelta(days=1))
    assert db.execute("SELECT count(*) FROM calls_default").fetchone() == (0,)
    assert max(waits) < 1.0, (max(waits), elapsed)
    assert elapsed > 2 * max(waits)  # the pass did take longer than any wait: the copy ran meanwhile


def test_a_remnant_keeps_many_rows_in_place_shrinks_and_is_folded_into_default(
    database_url: str, db: psycopg.Connection, monkeypatch: Any
) -> None:
    """More kept rows than SLICE_ROWS stay in a remnant partition (indexed like every partition,
    found by the same queries); once the rows nobody needs any more are deleted and at most
    SLICE_ROWS remain, the remnant is folded into DEFAULT and dropped."""
    monkeypatch.setattr(history, "SLICE_ROWS", 3)
    old = TODAY - timedelta(days=60)
    name = old_partition(db, old)
    promoted, promoted_run = version(db, 1, "promoted", None)
    _, rejected_run = version(db, 2, "rejected", promoted)
    serving = insert_trajectory(db, old + timedelta(hours=1), run=promoted_run)
    untrained = [insert_trajectory(db, old + timedelta(hours=2 + i)) for i in range(2)]
    for trajectory in untrained:
        reward(db, trajectory)
    insert_trajectory(db, old + timedelta(hours=5))  # neither: dropped
    settings = HistorySettings(retention_days=30)

    report = maintain(database_url, settings)
    remnant = history.remnant_name(name)
    assert report.dropped == [name] and report.remnants == [remnant], report
    assert (report.rows_kept, report.rows_dropped) == (6, 2), report
    assert where(db, serving) == [remnant, remnant] and where(db, untrained[0]) == [remnant, remnant]
    indexes = {
        row[0]
        for row in db.execute(
            "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = %s::regclass", (remnant,)
        )
    }
    parents = db.execute(
        "SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = 'calls'::regclass"
    ).fetchone()
    assert parents and len(indexes) == parents[0]  # every index of calls, attached, none missing
    assert db.execute(
        "SELECT count(*) FROM pg_constraint WHERE conrelid IN ('calls_default'::regclass, %s::regclass) "
        "AND contype = 'c' AND (conname LIKE '%%_bound' OR conname LIKE '%%_excluded')",
        (remnant,),
    ).fetchone() == (0,)  # the bounds' CHECKs are gone: the partition bounds say it

    # Still needed: the next pass leaves it.
    report = maintain(database_url, settings)
    assert report.remnant_rows_deleted == 0 and report.remnants_folded == [], report

    # One untrained run trained outside the serving lineage: 4 rows left, still above 3.
    db.execute("UPDATE trajectories SET trained_in_run_id = %s WHERE id = %s", (rejected_run, untrained[0]))
    report = maintain(database_url, settings)
    assert report.remnant_rows_deleted == 2 and report.remnants_folded == [], report
    assert where(db, untrained[0]) == []

    # The other one too: 2 rows left, folded into DEFAULT, the remnant dropped.
    db.execute("UPDATE trajectories SET trained_in_run_id = %s WHERE id = %s", (rejected_run, untrained[1]))
    report = maintain(database_url, settings)
    assert report.remnant_rows_deleted == 2 and report.remnants_folded == [remnant], report
    assert where(db, serving) == ["calls_default", "calls_default"]
    assert remnant not in dict(range_partitions(db))
    assert db.execute("SELECT to_regclass(%s)", (remnant,)).fetchone() == (None,)


def test_a_pass_stopped_before_its_swap_leaves_the_partition_and_is_redone(
    database_url: str, db: psycopg.Connection, monkeypatch: Any
) -> None:
    """A pass that cannot lock `calls` leaves the partition as it was: its remnant table is
    dropped (not attached), DEFAULT's CHECK stays harmless (true while the partition covers the
    range), and the next pass redoes the copy."""
    monkeypatch.setattr(history, "SLICE_ROWS", 1)
    monkeypatch.setattr(history, "DROP_LOCK_TRIES", 1)
    old = TODAY - timedelta(days=60)
    name = old_partition(db, old)
    _, run = version(db, 1, "promoted", None)
    kept = insert_trajectory(db, old + timedelta(hours=1), run=run)
    with psycopg.connect(database_url) as reader:
        reader.execute("SELECT count(*) FROM calls")  # holds ACCESS SHARE on calls until commit
        report = maintain(database_url, HistorySettings(retention_days=30, lock_timeout_s=0.2))
        assert report.skipped and "lock" in report.skipped and report.dropped == [], report
    assert where(db, kept) == [name, name]
    assert db.execute("SELECT to_regclass(%s)", (history.remnant_name(name),)).fetchone() == (None,)
    insert_call(db, kept, old + timedelta(hours=3))  # the partition still takes its rows

    report = maintain(database_url, HistorySettings(retention_days=30, lock_timeout_s=5))
    assert report.dropped == [name] and report.remnants == [history.remnant_name(name)], report
    assert where(db, kept) == [history.remnant_name(name)] * 3
