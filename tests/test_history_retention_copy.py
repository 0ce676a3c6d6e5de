"""Retention copies a partition's kept rows before it locks `calls` (apprentice/store/history.py):
what is written to the partition between the copy and the swap is applied, and the shipper's
inserts do not wait for the copy (measured on a partition of real size for this machine)."""

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
    old_partition,
    reward,
    version,
)

SETTINGS = HistorySettings(retention_days=30, lock_timeout_s=5)
# The measured partition: its calls, and one trajectory in KEPT_EVERY kept (the rows that are
# put back into `calls` under the lock: the part of the pass that still holds it).
CALLS = 200_000
KEPT_EVERY = 50


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

    dropped, kept_count = asyncio.run(drop_with_writes_in_between())
    late = drop_with_writes_in_between.late  # type: ignore[attr-defined]
    rows = kept_rows(db)
    assert rows[kept_calls[0]] == (kept, 777.0)
    assert kept_calls[1] not in rows
    assert rows[late][0] == kept and rows[moved][0] == kept
    assert {call for call, (trajectory, _) in rows.items() if trajectory == later_kept} and len(rows) == 5
    assert (dropped, kept_count) == (1, 5)  # 6 copied + 1 late - 1 deleted = 6 rows, 5 kept
    assert db.execute("SELECT to_regclass(%s)", (name,)).fetchone() == (None,)
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
    """200,000 calls in the old partition, 2 % of them kept; the shipper's path
    (insert_call_lines) stores a batch every 20 ms throughout the pass. Before this change the
    pass held ACCESS EXCLUSIVE on `calls` while it copied, and the shipper waited that long."""
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
    ), report
    assert max(waits) < 1.0, (max(waits), elapsed)
    assert elapsed > 2 * max(waits)  # the pass did take longer than any wait: the copy ran meanwhile
