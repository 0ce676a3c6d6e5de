"""Bulk storage of calls and trajectories from journal lines, and cross-process stitching.

Journal lines are copied into PostgreSQL as they are (COPY of raw JSON into a temporary
table) and unpacked there, so the shipper spends almost no Python CPU per call. Trajectory
rows are derived from the calls actually inserted, so a re-shipped batch changes nothing.

The canary arm a run was assigned (`arm` and the columns beside it, migration 0013) comes from
the first call that created its row and never changes afterwards: the analysis is by the arm
drawn when the run started.

A trajectory is trainable while every call of it is: the record's `trainable` (false for a
policy with record_for_training off) and the key's `training_opt_out`, read here as the calls
land (within a ship interval of the call), so an opt-out needs no gateway restart or cache.

An unserved attempt (an exploration sample, gateway/exploration) is a record with `served`
false and `explores_call_id` naming the served call it explores: its trajectory is stored with
`served` false, which the canary's arms leave out.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

import psycopg
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.store.connection import driver_connection
from gateway.store.rewards import MERGE_STATEMENTS as REWARD_MERGE_STATEMENTS
from gateway.store.rewards import lock_trajectories

STITCH_LOCK_ID = 0x4150_5354  # pg advisory lock held by the process running a stitch pass

_CREATE_INCOMING = "CREATE TEMP TABLE IF NOT EXISTS incoming_calls (r jsonb NOT NULL) ON COMMIT DELETE ROWS"

# The batch's keys are read FOR SHARE: an opt-out (gateway/auth/training_opt_out.py) updates the
# key row, so it waits for a batch in flight and then withdraws that batch's trajectories too,
# and a batch that starts after the opt-out reads the new flag. Read without the lock, a batch
# that read the flag before the opt-out committed could commit its trajectories as trainable
# after the withdrawal had run.
_INSERT_CALLS = """
WITH key_flags AS MATERIALIZED (
    SELECT k.id, k.training_opt_out FROM api_keys k
    WHERE k.id IN (SELECT (r->>'api_key_id')::uuid FROM incoming_calls)
    FOR SHARE
), inserted AS (
    INSERT INTO calls (id, response_id, trajectory_id, tenant, api_key_id, model, policy, upstream,
                       upstream_model, adapter_version_id, created_at, latency_ms, ttft_ms, status_code,
                       error, stream, request, response, prompt_tokens, completion_tokens, temperature,
                       continuation_key, parent_key, stitch_pending, protocol, native_request, native_response,
                       explores_call_id)
    SELECT (r->>'id')::uuid, r->>'response_id', (r->>'trajectory_id')::uuid, r->>'tenant',
           (r->>'api_key_id')::uuid, r->>'model', r->>'policy', r->>'upstream', r->>'upstream_model',
           (r->>'adapter_version_id')::uuid, to_timestamp((r->>'created_at')::float8),
           (r->>'latency_ms')::float8, (r->>'ttft_ms')::float8, (r->>'status_code')::int,
           CASE WHEN jsonb_typeof(r->'error') = 'null' THEN NULL ELSE r->'error' END,
           coalesce((r->>'stream')::boolean, false), r->'request',
           CASE WHEN jsonb_typeof(r->'response') = 'null' THEN NULL ELSE r->'response' END,
           (r->>'prompt_tokens')::int, (r->>'completion_tokens')::int, (r->>'temperature')::float8,
           decode(r->>'continuation_key', 'hex'), decode(r->>'parent_key', 'hex'),
           coalesce((r->>'stitch_pending')::boolean, false), coalesce(r->>'protocol', 'chat.completions'),
           CASE WHEN jsonb_typeof(r->'native_request') = 'null' THEN NULL ELSE r->'native_request' END,
           CASE WHEN jsonb_typeof(r->'native_response') = 'null' THEN NULL ELSE r->'native_response' END,
           (r->>'explores_call_id')::uuid
    FROM incoming_calls
    ON CONFLICT (id, created_at) DO NOTHING  -- the primary key (partitioned: migration 0012)
    RETURNING id, trajectory_id, tenant, model, policy, adapter_version_id, created_at
), per_trajectory AS (
    SELECT i.trajectory_id,
           min(i.tenant) AS tenant,
           (array_agg(i.model ORDER BY i.created_at))[1] AS model,
           (array_agg(i.policy ORDER BY i.created_at))[1] AS policy,
           (array_agg(i.adapter_version_id ORDER BY i.created_at))[1] AS adapter_version_id,
           (array_agg(c.r->>'arm' ORDER BY i.created_at))[1] AS arm,
           (array_agg((c.r->>'arm_version_id')::uuid ORDER BY i.created_at))[1] AS arm_version_id,
           (array_agg((c.r->>'arm_share')::float8 ORDER BY i.created_at))[1] AS arm_share,
           (array_agg(c.r->>'arm_unit' ORDER BY i.created_at))[1] AS arm_unit,
           (array_agg(c.r->>'task_key' ORDER BY i.created_at))[1] AS task_key,
           max(c.r->>'client_trajectory_id') AS client_trajectory_id,
           max(c.r->>'group_id') AS group_id,
           (array_agg(c.r->>'task_family' ORDER BY i.created_at))[1] AS task_family,
           min(i.created_at) AS first_call_at,
           max(i.created_at) AS last_call_at,
           count(*) AS n,
           bool_and(coalesce((c.r->>'trainable')::boolean, true) AND NOT coalesce(k.training_opt_out, false))
               AS trainable,
           bool_and(coalesce((c.r->>'served')::boolean, true)) AS served
    FROM inserted i JOIN incoming_calls c ON (c.r->>'id')::uuid = i.id
    LEFT JOIN key_flags k ON k.id = (c.r->>'api_key_id')::uuid
    GROUP BY i.trajectory_id
)
INSERT INTO trajectories AS t (id, tenant, model, policy, adapter_version_id, client_trajectory_id,
                               group_id, task_family, first_call_at, last_call_at, call_count, trainable, served,
                               arm, arm_version_id, arm_share, arm_unit, task_key)
SELECT trajectory_id, tenant, model, policy, adapter_version_id, client_trajectory_id, group_id,
       task_family, first_call_at, last_call_at, n, trainable, served, arm, arm_version_id, arm_share, arm_unit,
       task_key
FROM per_trajectory
ON CONFLICT (id) DO UPDATE SET
    first_call_at = least(t.first_call_at, excluded.first_call_at),
    last_call_at = greatest(t.last_call_at, excluded.last_call_at),
    call_count = t.call_count + excluded.call_count,
    client_trajectory_id = coalesce(t.client_trajectory_id, excluded.client_trajectory_id),
    group_id = coalesce(excluded.group_id, t.group_id),
    -- the family of the run's first call: a later call never renames it
    task_family = CASE WHEN excluded.first_call_at < t.first_call_at
                       THEN coalesce(excluded.task_family, t.task_family)
                       ELSE coalesce(t.task_family, excluded.task_family) END,
    trainable = t.trainable AND excluded.trainable,
    served = t.served AND excluded.served
"""

# Calls whose parent (the previous call of the same run) was served by another process:
# move their trajectory into the parent's. Newest parent wins when several match.
_FIND_MERGES = """
SELECT DISTINCT ON (c.trajectory_id) c.trajectory_id AS child, p.trajectory_id AS parent
FROM calls c
JOIN calls p ON p.continuation_key = c.parent_key AND p.created_at <= c.created_at
WHERE c.stitch_pending AND p.trajectory_id <> c.trajectory_id
ORDER BY c.trajectory_id, p.created_at DESC
LIMIT 1000
"""

_APPLY_MERGES = [
    """UPDATE calls SET trajectory_id = m.parent, stitch_pending = false
       FROM merges m WHERE calls.trajectory_id = m.child""",
    """UPDATE trajectories t SET merged_into = m.parent, call_count = 0
       FROM merges m WHERE t.id = m.child""",
    # A run is trainable only when every part of it is.
    """UPDATE trajectories t SET trainable = false
       FROM merges m JOIN trajectories ch ON ch.id = m.child
       WHERE t.id = m.parent AND NOT ch.trainable""",
    """UPDATE trajectories t SET merged_into = m.parent
       FROM merges m WHERE t.merged_into = m.child""",
    """UPDATE trajectories t SET
           call_count = s.n, first_call_at = s.first_call_at, last_call_at = s.last_call_at,
           group_id = coalesce(t.group_id, s.group_id),
           task_family = coalesce(t.task_family, s.task_family),
           client_trajectory_id = coalesce(t.client_trajectory_id, s.client_trajectory_id)
       FROM (SELECT c.trajectory_id, count(*) AS n, min(c.created_at) AS first_call_at,
                    max(c.created_at) AS last_call_at, max(ch.group_id) AS group_id,
                    max(ch.task_family) AS task_family, max(ch.client_trajectory_id) AS client_trajectory_id
             FROM calls c
             JOIN merges m ON c.trajectory_id = m.parent
             LEFT JOIN trajectories ch ON ch.id = m.child
             GROUP BY c.trajectory_id) s
       WHERE t.id = s.trajectory_id""",
]

_SETTLE_PENDING = """
UPDATE calls c SET stitch_pending = false
WHERE c.stitch_pending AND (
    c.created_at < now() - make_interval(secs => %(window_s)s)
    OR EXISTS (SELECT 1 FROM calls p WHERE p.continuation_key = c.parent_key
               AND p.trajectory_id = c.trajectory_id))
"""


# A JSON `\u0000` escape (a NUL character in a prompt or an answer) that is not itself escaped,
# i.e. preceded by an even number of backslashes. PostgreSQL's jsonb cannot hold NUL
# (22P05 untranslatable_character), so the whole batch would fail, and be retried, forever.
_NUL_ESCAPE = re.compile(rb"(?<!\\)((?:\\\\)*)\\u0000")
_REPLACEMENT_CHARACTER_ESCAPE = rb"\1\\ufffd"


def jsonb_safe(line: bytes) -> bytes:
    """The journal line with every NUL character replaced by U+FFFD, as jsonb can store it.

    The replacement keeps the text's shape (one character for one) and says that something
    unrepresentable stood there; a literal backslash followed by `u0000` is left alone.
    """
    if b"u0000" not in line:
        return line
    return _NUL_ESCAPE.sub(_REPLACEMENT_CHARACTER_ESCAPE, line)


def copy_payload(lines: list[bytes]) -> bytes:
    """Journal lines as COPY text rows: one JSON document per row, backslashes escaped."""
    return b"\n".join(jsonb_safe(line).replace(b"\\", b"\\\\") for line in lines) + b"\n"


@dataclass(frozen=True)
class RejectedLine:
    """A journal line PostgreSQL refused as data (not an outage): it can never be stored as is."""

    line: bytes
    reason: str


@dataclass(frozen=True)
class ShippedLines:
    stored: int
    rejected: list[RejectedLine]


async def _copy_and_insert(cursor: psycopg.AsyncCursor[object], lines: list[bytes]) -> None:
    async with cursor.copy("COPY incoming_calls (r) FROM STDIN") as copy:
        await copy.write(copy_payload(lines))
    await cursor.execute(_INSERT_CALLS)


async def insert_call_lines(engine: AsyncEngine, lines: list[bytes]) -> ShippedLines:
    """Store journal lines (JSON call records) in one transaction; duplicates are ignored.

    A batch that PostgreSQL refuses for its data (SQLSTATE class 22 or 23: a value no column
    can hold) is stored again line by line, each in a savepoint, and the lines refused alone are
    returned as rejected, so one bad record cannot stop every call behind it. An outage raises
    (the journal keeps the batch and the shipper retries).
    """
    async with engine.connect() as connection:
        pg = await driver_connection(connection)
        try:
            async with pg.transaction():
                async with pg.cursor() as cursor:
                    # The temporary table has no statistics, so the planner overestimates and
                    # JIT-compiles the insert: 300 ms of compilation for a 2,000-row batch.
                    await cursor.execute(f"SET LOCAL jit = off; {_CREATE_INCOMING}")
                    await _copy_and_insert(cursor, lines)
            return ShippedLines(stored=len(lines), rejected=[])
        except (psycopg.errors.DataError, psycopg.errors.IntegrityError):
            pass
        rejected: list[RejectedLine] = []
        async with pg.transaction():
            async with pg.cursor() as cursor:
                await cursor.execute(f"SET LOCAL jit = off; {_CREATE_INCOMING}")
                for line in lines:
                    try:
                        async with pg.transaction():  # a savepoint per line
                            await _copy_and_insert(cursor, [line])
                            await cursor.execute("TRUNCATE incoming_calls")
                    except (psycopg.errors.DataError, psycopg.errors.IntegrityError) as exc:
                        rejected.append(RejectedLine(line, f"{type(exc).__name__}: {exc.diag.message_primary}"))
    return ShippedLines(stored=len(lines) - len(rejected), rejected=rejected)


async def stitch_pending(engine: AsyncEngine, open_window_s: float) -> int:
    """Join trajectories split across gateway processes; returns how many were merged."""
    merged = 0
    async with engine.connect() as connection:
        pg = await driver_connection(connection)
        async with pg.transaction():
            async with pg.cursor() as cursor:
                await cursor.execute("SET LOCAL jit = off")
                await cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", (STITCH_LOCK_ID,))
                row = await cursor.fetchone()
                if not row or not row[0]:
                    return 0  # another process is stitching right now
                for _ in range(10):  # chains of splits resolve one link per round
                    await cursor.execute(_FIND_MERGES)
                    pairs = await cursor.fetchall()
                    if not pairs:
                        break
                    await cursor.execute(
                        "CREATE TEMP TABLE IF NOT EXISTS merges (child uuid, parent uuid) ON COMMIT DROP"
                    )
                    await cursor.execute("TRUNCATE merges")
                    # A parent that is itself being merged this round waits for the next round.
                    children = {child for child, _ in pairs}
                    pairs = [(child, parent) for child, parent in pairs if parent not in children] or pairs[:1]
                    await cursor.executemany("INSERT INTO merges VALUES (%s, %s)", pairs)
                    # Reward intake and the linker change a trajectory's rewards under this lock:
                    # without it a reward resolved to a child just before the merge lands on it after.
                    await lock_trajectories(cursor, {t for pair in pairs for t in pair})
                    for statement in _APPLY_MERGES + REWARD_MERGE_STATEMENTS:
                        await cursor.execute(statement)
                    merged += len(pairs)
                await cursor.execute(_SETTLE_PENDING, {"window_s": open_window_s})
    return merged


# The run a call continues, when another process served its parent: the parent call by the
# continuation key it registered (ix_calls_continuation_key), its trajectory followed to the root.
# Bounded to the stitch window's partitions: an older parent is no longer an open run.
_FIND_PARENT = """
SELECT coalesce(t.merged_into, c.trajectory_id) AS trajectory_id, c.adapter_version_id
FROM calls c JOIN trajectories t ON t.id = c.trajectory_id
WHERE c.continuation_key = %(key)s AND c.tenant = %(tenant)s
  AND c.created_at > now() - make_interval(secs => %(window_s)s)
ORDER BY c.created_at DESC
LIMIT 1
"""


@dataclass(frozen=True)
class ParentCall:
    trajectory_id: uuid.UUID
    adapter_version_id: uuid.UUID | None


async def find_parent_call(engine: AsyncEngine, tenant: str, key: bytes, window_s: float) -> ParentCall | None:
    """The stored call whose answer a new call continues (by its continuation key), if any."""
    async with engine.connect() as connection:
        pg = await driver_connection(connection)
        async with pg.cursor() as cursor:
            await cursor.execute(_FIND_PARENT, {"key": key, "tenant": tenant, "window_s": window_s})
            row = await cursor.fetchone()
        await pg.commit()
    return ParentCall(row[0], row[1]) if row else None
