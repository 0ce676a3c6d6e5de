"""The partitioned `calls` table (migration 0012, apprentice/store/history.py, docs/history.md):
the migration moves existing rows and comes back down, partitions are created ahead (once, even
with several processes at it), retention drops old partitions but keeps what untrained and
serving-lineage trajectories need, and the shipper stays exactly-once across partitions.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from alembic import command
from psycopg import sql

from apprentice.settings import HistorySettings
from apprentice.store import history
from apprentice.store.schema import alembic_config, upgrade
from tests.conftest import _admin, _with_database

NOW = datetime.now(timezone.utc)
TODAY = NOW.replace(hour=0, minute=0, second=0, microsecond=0)


@pytest.fixture
def empty_database(pg_admin_url: str) -> Any:
    """A database with no schema at all, to migrate step by step."""
    name = f"apprentice_hist_{uuid.uuid4().hex[:10]}"
    with _admin(pg_admin_url) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    yield _with_database(pg_admin_url, name)
    with _admin(pg_admin_url) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def insert_call(db: psycopg.Connection, trajectory: uuid.UUID, created_at: datetime, **columns: Any) -> uuid.UUID:
    call = uuid.uuid4()
    db.execute(
        "INSERT INTO calls (id, trajectory_id, tenant, model, policy, created_at, status_code, request) "
        "VALUES (%s, %s, 't', 'm', 'p', %s, 200, %s)",
        (call, trajectory, created_at, json.dumps(columns or {"messages": []})),
    )
    return call


def insert_trajectory(db: psycopg.Connection, at: datetime, *, run: uuid.UUID | None = None) -> uuid.UUID:
    trajectory = uuid.uuid4()
    db.execute(
        "INSERT INTO trajectories (id, tenant, model, policy, first_call_at, last_call_at, call_count, "
        "trained_in_run_id) VALUES (%s, 't', 'm', 'p', %s, %s, 2, %s)",
        (trajectory, at, at, run),
    )
    insert_call(db, trajectory, at)
    insert_call(db, trajectory, at + timedelta(minutes=1))
    return trajectory


def reward(db: psycopg.Connection, trajectory: uuid.UUID) -> None:
    db.execute(
        "INSERT INTO rewards (id, tenant, target_kind, target, trajectory_id, status, value, content_hash, "
        "source, observed_at) VALUES (%s, 't', 'trajectory', %s, %s, 'linked', 1.0, '\\x00', 'key', now())",
        (uuid.uuid4(), str(trajectory), trajectory),
    )


def version(db: psycopg.Connection, number: int, status: str, parent: uuid.UUID | None) -> tuple[uuid.UUID, uuid.UUID]:
    """An adapter version and the training run that produced it: (version id, run id)."""
    run, version_id = uuid.uuid4(), uuid.uuid4()
    db.execute("INSERT INTO training_runs (id, policy, status) VALUES (%s, 'p', 'succeeded')", (run,))
    db.execute(
        "INSERT INTO adapter_versions (id, policy, version, name, status, base_model, path, parent_version_id, "
        "training_run_id) VALUES (%s, 'p', %s, %s, %s, 'base', '/nowhere', %s, %s)",
        (version_id, number, f"p-v{number}", status, parent, run),
    )
    return version_id, run


def old_partition(db: psycopg.Connection, lower: datetime) -> str:
    name = history.partition_name(lower)
    ddl(db, name, lower)
    return name


def ddl(db: psycopg.Connection, name: str, lower: datetime) -> None:
    """A one-day partition made with DDL (which takes no server-side parameters)."""
    db.execute(
        sql.SQL("CREATE TABLE {} PARTITION OF calls FOR VALUES FROM ({}) TO ({})").format(
            sql.Identifier(name), sql.Literal(lower), sql.Literal(lower + timedelta(days=1))
        )
    )


def where(db: psycopg.Connection, trajectory: uuid.UUID) -> list[str]:
    rows = db.execute(
        "SELECT tableoid::regclass::text FROM calls WHERE trajectory_id = %s ORDER BY created_at", (trajectory,)
    )
    return [row[0] for row in rows.fetchall()]


def maintain(url: str, settings: HistorySettings, now: datetime = NOW) -> history.MaintenanceReport:
    async def run() -> history.MaintenanceReport:
        async with await psycopg.AsyncConnection.connect(url) as connection:
            return await history.maintain(connection, settings, now)

    return asyncio.run(run())


def range_partitions(db: psycopg.Connection) -> list[tuple[str, str]]:
    rows = db.execute(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = 'calls'::regclass ORDER BY 1"
    )
    return [(row[0], row[1]) for row in rows.fetchall()]


def test_migration_moves_existing_calls_into_monthly_partitions_and_downgrades(empty_database: str) -> None:
    upgrade(empty_database, "0011")
    with psycopg.connect(empty_database, autocommit=True) as db:
        db.execute(
            "INSERT INTO calls (id, trajectory_id, tenant, model, created_at, status_code, request) "
            "SELECT gen_random_uuid(), gen_random_uuid(), 't', 'm', now() - make_interval(days => g), 200, '{}' "
            "FROM generate_series(0, 70) g"
        )
        ids = {row[0] for row in db.execute("SELECT id FROM calls").fetchall()}
    upgrade(empty_database, "head")
    with psycopg.connect(empty_database, autocommit=True) as db:
        assert db.execute("SELECT relkind FROM pg_class WHERE relname = 'calls'").fetchone() == ("p",)
        assert {row[0] for row in db.execute("SELECT id FROM calls").fetchall()} == ids
        assert db.execute("SELECT count(*) FROM calls_default").fetchone() == (0,)
        names = [name for name, _ in range_partitions(db)]
        (oldest_call,) = db.execute("SELECT min(created_at) FROM calls").fetchone()
        oldest = oldest_call.astimezone(timezone.utc).replace(day=1)
        assert f"calls_p{oldest:%Y%m%d}" in names  # a month of history in one partition
        # The migration takes "today" when it runs; a run that crosses midnight UTC after this
        # module was imported has the next day's partitions, so both days are accepted.
        migration_days = {TODAY, datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)}
        assert any(
            all(history.partition_name(day + timedelta(days=ahead)) in names for ahead in range(8))
            for day in migration_days
        ), names  # today and a week ahead, one a day
        key = db.execute("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'calls_pkey'").fetchone()
        assert key == ("PRIMARY KEY (id, created_at)",)
        indexes = {row[0] for row in db.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'calls'")}
        assert {"ix_calls_trajectory", "ix_calls_response_id", "ix_calls_parent_key_pending"} <= indexes
    command.downgrade(alembic_config(empty_database), "0011")
    with psycopg.connect(empty_database, autocommit=True) as db:
        assert db.execute("SELECT relkind FROM pg_class WHERE relname = 'calls'").fetchone() == ("r",)
        assert {row[0] for row in db.execute("SELECT id FROM calls").fetchall()} == ids
        key = db.execute("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'calls_pkey'").fetchone()
        assert key == ("PRIMARY KEY (id)",)


def test_partitions_are_created_ahead_once_even_by_concurrent_processes(
    database_url: str, db: psycopg.Connection
) -> None:
    settings = HistorySettings(partition_interval="week", create_ahead_days=30)
    later = NOW + timedelta(days=3)

    async def two_processes() -> list[history.MaintenanceReport]:
        async with (
            await psycopg.AsyncConnection.connect(database_url) as one,
            await psycopg.AsyncConnection.connect(database_url) as two,
        ):
            return list(
                await asyncio.gather(history.maintain(one, settings, later), history.maintain(two, settings, later))
            )

    reports = asyncio.run(two_processes())
    created = [name for report in reports for name in report.created]
    assert len(created) == len(set(created)) and created, reports
    bounds = [(p.lower, p.upper) for p in asyncio.run(_listing(database_url))]
    assert all(upper == next_lower for (_, upper), (next_lower, _) in zip(bounds, bounds[1:], strict=False))
    assert bounds[-1][1] >= later + timedelta(days=30)
    assert bounds[-1][1] - bounds[-1][0] == timedelta(days=7)  # the new ones are weeks
    assert maintain(database_url, settings, later).created == []  # nothing left to make


async def _listing(url: str) -> list[history.Partition]:
    async with await psycopg.AsyncConnection.connect(url) as connection:
        return await history.partitions(connection)


def test_a_call_beyond_every_partition_waits_in_default_and_moves_into_its_new_partition(
    database_url: str, db: psycopg.Connection
) -> None:
    far = TODAY + timedelta(days=20, hours=5)
    trajectory = uuid.uuid4()
    insert_call(db, trajectory, far)
    assert where(db, trajectory) == ["calls_default"]
    report = maintain(database_url, HistorySettings(create_ahead_days=7), now=NOW + timedelta(days=14))
    assert report.moved_from_default == 1
    assert where(db, trajectory) == [history.partition_name(TODAY + timedelta(days=20))]


def test_retention_drops_old_partitions_and_keeps_untrained_and_serving_lineage_calls(
    database_url: str, db: psycopg.Connection
) -> None:
    old, older = TODAY - timedelta(days=60), TODAY - timedelta(days=61)
    names = [old_partition(db, older), old_partition(db, old)]
    promoted, promoted_run = version(db, 1, "promoted", None)
    canary_parent, parent_run = version(db, 2, "retired", promoted)
    _, canary_run = version(db, 3, "canary", canary_parent)
    _, rejected_run = version(db, 4, "rejected", promoted)
    at = old + timedelta(hours=3)
    rewarded_untrained = insert_trajectory(db, at)
    reward(db, rewarded_untrained)
    trained_promoted = insert_trajectory(db, at, run=promoted_run)
    trained_ancestor = insert_trajectory(db, older + timedelta(hours=1), run=parent_run)
    trained_canary = insert_trajectory(db, at, run=canary_run)
    trained_rejected = insert_trajectory(db, at, run=rejected_run)
    unrewarded = insert_trajectory(db, at)
    recent = insert_trajectory(db, NOW - timedelta(hours=1))
    assert where(db, rewarded_untrained) == [names[1], names[1]]

    report = maintain(database_url, HistorySettings(retention_days=30))

    assert report.dropped == names, report
    assert (report.rows_kept, report.rows_dropped) == (8, 4), report
    remaining = {name for name, _ in range_partitions(db)}
    assert not remaining & set(names)
    for kept in (rewarded_untrained, trained_promoted, trained_ancestor, trained_canary):
        assert where(db, kept) == ["calls_default", "calls_default"]
    for dropped in (trained_rejected, unrewarded):
        assert where(db, dropped) == []
        # The trajectory and its rewards stay: counts, provenance and evaluations read them.
        assert db.execute("SELECT call_count FROM trajectories WHERE id = %s", (dropped,)).fetchone() == (2,)
    assert len(where(db, recent)) == 2  # within retention: untouched

    # Once trained by a run outside the serving lineage, the kept calls go on the next pass.
    db.execute("UPDATE trajectories SET trained_in_run_id = %s WHERE id = %s", (rejected_run, rewarded_untrained))
    report = maintain(database_url, HistorySettings(retention_days=30))
    assert report.default_rows_deleted == 2 and report.dropped == []
    assert where(db, rewarded_untrained) == []
    assert len(where(db, trained_promoted)) == 2


def test_retention_leaves_a_partition_made_by_hand_and_the_recent_ones(
    database_url: str, db: psycopg.Connection
) -> None:
    lower = TODAY - timedelta(days=90)
    ddl(db, "calls_archive_2026", lower)
    before = {name for name, _ in range_partitions(db)}
    report = maintain(database_url, HistorySettings(retention_days=1))
    assert report.dropped == []
    assert {name for name, _ in range_partitions(db)} == before


def db_history(config: Any, *args: str) -> subprocess.CompletedProcess[str]:
    """`apprentice db history` in its own process, as an operator runs it."""
    return subprocess.run(
        [sys.executable, "-m", "apprentice.cli", "db", "history", "-c", str(config), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_cli_runs_the_maintenance_and_lists_partitions(
    database_url: str, db: psycopg.Connection, tmp_path: Any
) -> None:
    name = old_partition(db, TODAY - timedelta(days=10))
    trajectory = insert_trajectory(db, TODAY - timedelta(days=10) + timedelta(hours=1))
    config = tmp_path / "config.yaml"
    config.write_text(f"database_url: {database_url}\n")
    done = db_history(config, "--retention-days", "5")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["dropped"] == [name] and result["rows_dropped"] == 2
    assert name not in [p["name"] for p in result["partitions"]]
    assert where(db, trajectory) == []
    listed = db_history(config, "--list")
    assert listed.returncode == 0 and "dropped" not in json.loads(listed.stdout)
    refused = db_history(config, "--retention-days", "0")
    assert refused.returncode == 2 and "retention-days" in refused.stderr
