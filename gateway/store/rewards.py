"""Rewards in PostgreSQL: set-based intake, linking of pending rewards, and "current" upkeep.

Every accepted reward is a row; nothing is deleted. A row is *current* (status 'linked',
superseded_at NULL) when it is the latest of its trajectory and name, where "latest" is the
greatest (observed_at, seq) among the rows that are themselves the latest of their
idempotency key. That is a pure function of the set of rows, so the outcome does not depend
on the order in which duplicates, replays and late rewards arrive: `_RECOMPUTE` re-derives
superseded_at for the trajectories and keys a transaction touched, and `_INSERT_CURRENT`
derives the same in the insert itself when the transaction's keys are all new (the common
case: one reward per run, each under its own key).

Concurrency: writers take transaction-scoped advisory locks, first on the idempotency keys
of their batch, then (when they add pending rewards under a bound) on their tenants, then on
every trajectory whose rewards they may change, each set in sorted order (so no two writers
wait on each other in a cycle). The linker takes the same locks, and so does the stitcher
(gateway/store/calls.py) on the children and parents it merges, through `lock_trajectories`.
A writer finds a reward's trajectory (the root, after merges) before it holds that lock, so it
checks once it does: a root merged meanwhile makes intake start over (`_RootMoved`) and leaves
the linker's reward pending for its next pass; otherwise a reward could land on a child
already merged away, where no reader looks.
A deadlock with the call shipper's row locks is possible in principle; the transaction is
then retried.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import Awaitable, Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import orjson
import psycopg
import sqlalchemy.exc
from psycopg.rows import dict_row
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.store.connection import driver_connection

RETRIES = 5
T = TypeVar("T")

_REWARD_COLUMNS = """r.id, r.status, r.trajectory_id, r.target_kind, r.target, r.name, r.value, r.metrics,
    r.comment, r.group_id, r.idempotency_key, r.observed_at, r.received_at, r.linked_at,
    r.superseded_at, r.reject_reason"""

_EXISTING_KEYS = """
SELECT r.tenant, r.idempotency_key, r.content_hash, r.id, r.trajectory_id
FROM rewards r
JOIN unnest(%(tenants)s::text[], %(keys)s::text[]) AS q(tenant, k) ON r.tenant = q.tenant AND r.idempotency_key = q.k
"""

_CALL_UUID = (
    "CASE WHEN {col} ~* '^[0-9a-f]{{8}}-[0-9a-f]{{4}}-[0-9a-f]{{4}}-[0-9a-f]{{4}}-[0-9a-f]{{12}}$' THEN {col}::uuid END"
)


def _target_trajectory(reward: str) -> str:
    """`CROSS JOIN LATERAL (...) x`: x.tid, the trajectory the reward row `reward` (an alias with
    tenant, target_trajectory_id and target_call) names, the one rule for resolving a target: its
    trajectory id as given, else a call of the tenant by its uuid, else by its response id (the
    newest when several calls of the tenant share one). Used when a reward arrives (_RESOLVE) and
    when a pending one is retried (_PENDING_CANDIDATES)."""
    call_uuid = _CALL_UUID.format(col=f"{reward}.target_call")
    return f"""CROSS JOIN LATERAL (SELECT coalesce(
    {reward}.target_trajectory_id,
    (SELECT c.trajectory_id FROM calls c
     WHERE c.id = {call_uuid} AND c.tenant = {reward}.tenant),
    (SELECT c.trajectory_id FROM calls c WHERE c.response_id = {reward}.target_call AND c.tenant = {reward}.tenant
     ORDER BY c.created_at DESC LIMIT 1)) AS tid) x"""


# The trajectory a target names, if stored, then the root of a merged trajectory. Each lookup is
# a probe by primary key (LATERAL ... OFFSET 0): as joins, the planner hashed the whole
# trajectories table for a few rewards (57 ms a group at 50,000 trajectories).
_RESOLVE_ITEMS = """
SELECT i.ord, rt.id AS trajectory_id, rt.policy
FROM jsonb_to_recordset(%(items)s::jsonb) AS i(ord int, tenant text, target_trajectory_id uuid, target_call text)
"""
_RESOLVE_ROOT = """
LEFT JOIN LATERAL (SELECT coalesce(t.merged_into, t.id) AS root FROM trajectories t
                   WHERE t.id = x.tid AND t.tenant = i.tenant OFFSET 0) t ON true
LEFT JOIN LATERAL (SELECT rt.id, rt.policy FROM trajectories rt WHERE rt.id = t.root OFFSET 0) rt ON true
"""
_RESOLVE = _RESOLVE_ITEMS + _target_trajectory("i") + _RESOLVE_ROOT
# The same when every target is a trajectory id (the common case): no mention of `calls`. A
# query that names the partitioned `calls` is planned over, and locks, every partition and its
# indexes (80 locks with 9 partitions, 63 of them past the 16 fast-path slots, in PostgreSQL's
# shared lock manager, where the shipper's and every other backend's locks meet) even when the
# coalesce never reaches it: 13 locks, all fast-path, without it.
_RESOLVE_TRAJECTORIES = _RESOLVE_ITEMS + "CROSS JOIN LATERAL (SELECT i.target_trajectory_id AS tid) x" + _RESOLVE_ROOT

_INSERT = """
INSERT INTO rewards (id, tenant, target_kind, target, target_trajectory_id, target_call, trajectory_id, status,
                     linked_at, name, value, metrics, comment, group_id, idempotency_key, content_hash, source,
                     api_key_id, observed_at, judgement_id)
SELECT i.id, i.tenant, i.target_kind, i.target, i.target_trajectory_id, i.target_call, i.trajectory_id,
       CASE WHEN i.trajectory_id IS NULL THEN 'pending' ELSE 'linked' END,
       CASE WHEN i.trajectory_id IS NULL THEN NULL ELSE now() END,
       i.name, i.value, coalesce(i.metrics, '{}'::jsonb), i.comment, i.group_id, i.idempotency_key,
       decode(i.content_hash, 'hex'), i.source, i.api_key_id, coalesce(to_timestamp(i.observed_at), now()),
       i.judgement_id
FROM jsonb_to_recordset(%(rows)s::jsonb) AS i(
    ord int, id uuid, tenant text, target_kind text, target text, target_trajectory_id uuid, target_call text,
    trajectory_id uuid, name text, value float8, metrics jsonb, comment text, group_id text,
    idempotency_key text, content_hash text, source text, api_key_id uuid, observed_at float8, judgement_id uuid)
ORDER BY i.ord
ON CONFLICT (tenant, idempotency_key, content_hash) WHERE idempotency_key IS NOT NULL DO NOTHING
"""

# The common case in one statement: every fresh reward's idempotency key is absent, or new (no
# row stored under it, used once in the group). Such rows cannot change which row is the latest
# of any other key, so the only rows whose superseded_at can change are each touched slot's
# current row and the new rows: the latest of them by (observed_at, seq) stays current, the
# others are superseded, exactly what `_RECOMPUTE` would derive. New rows take seq values after
# every stored row, in group order, so among them "later" is (observed_at, ord), and a tie with
# the current row goes to the new row. No ON CONFLICT: under the keys' locks a new key cannot
# have been stored meanwhile, and if it had, failing the group beats a wrong current reward.
# The rows to supersede are found by their ids (`= ANY`): as a join, the planner scanned the table.
_INSERT_CURRENT = """
WITH i AS (
    SELECT i.*, coalesce(to_timestamp(i.observed_at), now()) AS observed
    FROM jsonb_to_recordset(%(rows)s::jsonb) AS i(
        ord int, id uuid, tenant text, target_kind text, target text, target_trajectory_id uuid, target_call text,
        trajectory_id uuid, name text, value float8, metrics jsonb, comment text, group_id text,
        idempotency_key text, content_hash text, source text, api_key_id uuid, observed_at float8, judgement_id uuid)
), cur AS (
    SELECT c.id, c.trajectory_id, c.name, c.observed_at
    FROM (SELECT DISTINCT trajectory_id, name FROM i WHERE trajectory_id IS NOT NULL) s
    CROSS JOIN LATERAL (SELECT r.id, r.trajectory_id, r.name, r.observed_at FROM rewards r
                        WHERE r.trajectory_id = s.trajectory_id AND r.name = s.name AND r.status = 'linked'
                          AND r.superseded_at IS NULL OFFSET 0) c
), ins AS (
    INSERT INTO rewards (id, tenant, target_kind, target, target_trajectory_id, target_call, trajectory_id, status,
                         linked_at, name, value, metrics, comment, group_id, idempotency_key, content_hash, source,
                         api_key_id, observed_at, judgement_id, superseded_at)
    SELECT i.id, i.tenant, i.target_kind, i.target, i.target_trajectory_id, i.target_call, i.trajectory_id,
           CASE WHEN i.trajectory_id IS NULL THEN 'pending' ELSE 'linked' END,
           CASE WHEN i.trajectory_id IS NULL THEN NULL ELSE now() END,
           i.name, i.value, coalesce(i.metrics, '{}'::jsonb), i.comment, i.group_id, i.idempotency_key,
           decode(i.content_hash, 'hex'), i.source, i.api_key_id, i.observed, i.judgement_id,
           CASE WHEN i.trajectory_id IS NOT NULL AND (
               EXISTS (SELECT 1 FROM i l WHERE l.trajectory_id = i.trajectory_id AND l.name = i.name
                       AND (l.observed, l.ord) > (i.observed, i.ord))
               OR EXISTS (SELECT 1 FROM cur c WHERE c.trajectory_id = i.trajectory_id AND c.name = i.name
                          AND c.observed_at > i.observed)) THEN now() END
    FROM i
    ORDER BY i.ord
    RETURNING 1
)
UPDATE rewards u SET superseded_at = now()
WHERE u.id = ANY(ARRAY(SELECT c.id FROM cur c
                       WHERE EXISTS (SELECT 1 FROM i WHERE i.trajectory_id = c.trajectory_id AND i.name = c.name
                                     AND i.observed >= c.observed_at)))
"""

# Re-derive superseded_at for the rewards of some trajectories ({trajectories}: a query of
# uuids) and of some idempotency keys ({keys}: a query of (tenant, k)), including every
# trajectory that a row of those keys is linked to.
_K_LATEST = """({r}.idempotency_key IS NULL OR NOT EXISTS (
    SELECT 1 FROM rewards o WHERE o.tenant = {r}.tenant AND o.idempotency_key = {r}.idempotency_key
    AND (o.observed_at, o.seq) > ({r}.observed_at, {r}.seq)))"""

# The slots (trajectory, name) that may change are those holding a current row, plus those of
# the keys' rows; each slot's winner is found by walking ix_rewards_slot from the newest row
# (history never has to be scanned), and only current rows, winners and the keys' rows are
# candidates for a change. Every lookup is a LATERAL probe of an index by its key (the keys
# through uq_rewards_idempotency, the slots through ix_rewards_current): joins left to the
# planner scanned every current reward of the table (a fresh table's statistics say it is
# empty), which cost milliseconds per reward and grew with the table. `OFFSET 0` keeps the
# planner from flattening a probe back into such a join, and the rows to change are found
# by their ids (`= ANY`), not by a join the planner may turn into a scan of the table.
_RECOMPUTE = (
    """
WITH q(tenant, k) AS (
    {keys}
), kg AS (
    SELECT r.id, r.trajectory_id, r.name FROM q
    CROSS JOIN LATERAL (SELECT r.id, r.trajectory_id, r.name FROM rewards r
                        WHERE r.tenant = q.tenant AND r.idempotency_key = q.k OFFSET 0) r
), trajs(trajectory_id) AS (
    {trajectories} UNION SELECT trajectory_id FROM kg WHERE trajectory_id IS NOT NULL
), slots AS (
    SELECT c.trajectory_id, c.name FROM trajs t
    CROSS JOIN LATERAL (SELECT r.trajectory_id, r.name FROM rewards r
                        WHERE r.trajectory_id = t.trajectory_id AND r.status = 'linked'
                          AND r.superseded_at IS NULL OFFSET 0) c
    UNION SELECT trajectory_id, name FROM kg WHERE trajectory_id IS NOT NULL
), win AS (
    SELECT w.id FROM slots s
    CROSS JOIN LATERAL (
        SELECT r.id FROM rewards r
        WHERE r.trajectory_id = s.trajectory_id AND r.name = s.name AND r.status = 'linked'
          AND """
    + _K_LATEST.format(r="r")
    + """
        ORDER BY r.observed_at DESC, r.seq DESC LIMIT 1) w
), cand AS (
    SELECT c.id FROM slots s
    CROSS JOIN LATERAL (SELECT r.id FROM rewards r
                        WHERE r.trajectory_id = s.trajectory_id AND r.name = s.name AND r.status = 'linked'
                          AND r.superseded_at IS NULL OFFSET 0) c
    UNION SELECT id FROM win
    UNION SELECT id FROM kg
), decided AS (
    SELECT c.id, c.superseded_at,
           (c.id IN (SELECT id FROM win) OR (c.status = 'pending' AND """
    + _K_LATEST.format(r="c")
    + """)) AS keep
    FROM rewards c JOIN cand USING (id)
), flips AS (
    SELECT id, keep FROM decided WHERE keep = (superseded_at IS NOT NULL)
)
UPDATE rewards u SET superseded_at = CASE WHEN f.keep THEN NULL ELSE now() END
FROM flips f WHERE u.id = f.id AND u.id = ANY(ARRAY(SELECT id FROM flips))
"""
)

_RECOMPUTE_GIVEN = _RECOMPUTE.format(
    keys="SELECT * FROM unnest(%(tenants)s::text[], %(keys)s::text[])",
    trajectories="SELECT unnest(%(trajectories)s::uuid[])",
)

# A trajectory's group: the group_id of its latest linked reward that names one.
_GROUPS = """
UPDATE trajectories t SET group_id = g.group_id
FROM (SELECT DISTINCT ON (r.trajectory_id) r.trajectory_id, r.group_id FROM rewards r
      WHERE r.trajectory_id IN ({trajectories}) AND r.group_id IS NOT NULL AND r.status = 'linked'
      ORDER BY r.trajectory_id, r.observed_at DESC, r.seq DESC) g
WHERE t.id = g.trajectory_id AND t.group_id IS DISTINCT FROM g.group_id
"""

_GROUPS_GIVEN = _GROUPS.format(trajectories="SELECT unnest(%(trajectories)s::uuid[])")

# Run by the stitcher (gateway/store/calls.py) inside its merge transaction, with the temp
# table merges(child, parent): a merged trajectory's rewards follow it into the parent.
MERGE_STATEMENTS = [
    "UPDATE rewards r SET trajectory_id = m.parent FROM merges m WHERE r.trajectory_id = m.child",
    _RECOMPUTE.format(keys="SELECT NULL::text, NULL::text WHERE false", trajectories="SELECT parent FROM merges"),
    _GROUPS.format(trajectories="SELECT parent FROM merges"),
]

_PENDING_CANDIDATES = f"""
SELECT r.id, r.tenant, r.idempotency_key, rt.id AS root, rt.policy, r.name, r.value, r.metrics
FROM rewards r
{_target_trajectory("r")}
JOIN trajectories t ON t.id = x.tid AND t.tenant = r.tenant
JOIN trajectories rt ON rt.id = coalesce(t.merged_into, t.id)
WHERE r.status = 'pending' AND (%(all)s OR r.received_at > now() - make_interval(secs => %(window_s)s))
ORDER BY r.received_at
LIMIT %(limit)s
"""

_LINK = """
UPDATE rewards r SET trajectory_id = c.root, status = c.status, reject_reason = c.reason, linked_at = now()
FROM jsonb_to_recordset(%(links)s::jsonb) AS c(id uuid, root uuid, status text, reason text)
WHERE r.id = c.id AND r.status = 'pending'
"""

_ANSWERS = f"SELECT {_REWARD_COLUMNS} FROM rewards r WHERE r.id = ANY(%(ids)s::uuid[])"

# Rewards waiting for their trajectory (overdue past the window) and rewards their policy refused.
_UNLINKED_LIST = f"""
SELECT {_REWARD_COLUMNS},
       r.status = 'pending' AND r.received_at < now() - make_interval(secs => %(window_s)s) AS overdue
FROM rewards r
WHERE r.status = ANY(%(statuses)s::text[]) AND (%(tenant)s::text IS NULL OR r.tenant = %(tenant)s)
  AND (NOT %(overdue_only)s OR r.status <> 'pending' OR r.received_at < now() - make_interval(secs => %(window_s)s))
ORDER BY r.received_at
LIMIT %(limit)s
"""

_UNLINKED_COUNTS = """
SELECT count(*) FILTER (WHERE status = 'pending') AS pending,
       count(*) FILTER (WHERE status = 'pending' AND received_at < now() - make_interval(secs => %(window_s)s))
           AS overdue,
       count(*) FILTER (WHERE status = 'rejected') AS rejected
FROM rewards
WHERE (status = 'pending' OR status = 'rejected') AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
"""


@dataclass(frozen=True, slots=True)
class NewReward:
    """A reward as a request gave it, its target resolved as far as the request alone allows."""

    id: uuid.UUID
    tenant: str
    target_kind: str  # "trajectory" or "call"
    target: str  # the id the sender named
    target_trajectory_id: uuid.UUID | None  # known from the request (a gateway or client trajectory id)
    target_call: str | None  # a call's uuid or response id, resolved in the store
    name: str
    value: float
    metrics: dict[str, float]
    comment: str | None
    group_id: str | None
    idempotency_key: str | None
    source: str  # "key", "webhook:<secret name>" or "judge"
    api_key_id: uuid.UUID | None
    observed_at: float | None  # unix seconds; None: when the store receives it
    judgement_id: uuid.UUID | None = None  # a judge's score: the judgement it came from


@dataclass(frozen=True, slots=True)
class StoredReward:
    """A row of `rewards` as readers see it: exactly the columns of `_REWARD_COLUMNS`, so that a
    column added or renamed there fails here loudly instead of changing an answer."""

    id: uuid.UUID
    status: str  # "pending", "linked" or "rejected"
    trajectory_id: uuid.UUID | None  # the root trajectory once linked (after merges)
    target_kind: str
    target: str
    name: str
    value: float
    metrics: dict[str, float]
    comment: str | None
    group_id: str | None
    idempotency_key: str | None
    observed_at: datetime
    received_at: datetime
    linked_at: datetime | None
    superseded_at: datetime | None
    reject_reason: str | None

    @property
    def current(self) -> bool:
        """The reward of its trajectory and name that counts (the learner trains on it)."""
        return self.status == "linked" and self.superseded_at is None


@dataclass(frozen=True, slots=True)
class UnlinkedReward(StoredReward):
    overdue: bool  # pending for longer than the pending window


@dataclass(frozen=True, slots=True)
class UnlinkedRewards:
    """A page of rewards that are not linked, with the counts of all of them."""

    rewards: list[UnlinkedReward]
    pending_count: int
    overdue_count: int
    rejected_count: int
    has_more: bool


class ReplayedSignature(Exception):
    """The webhook signature was accepted before."""


class TooManyPending(Exception):
    """The batch would leave a tenant with more pending rewards than it may hold."""

    def __init__(self, tenant: str, pending: int, adding: int, limit: int) -> None:
        super().__init__(
            f"tenant {tenant!r} holds {pending} pending rewards (their trajectories are not stored) and this request "
            f"would add {adding}; the limit is {limit}. Pending rewards expire; send rewards for runs it served."
        )
        self.tenant = tenant


_PENDING_COUNTS = """
SELECT tenant, count(*) AS n FROM rewards
WHERE status = 'pending' AND tenant = ANY(%(tenants)s::text[]) GROUP BY tenant
"""


async def _pending_held(cursor: psycopg.AsyncCursor[dict[str, Any]], tenants: set[str]) -> dict[str, int]:
    """How many pending rewards each tenant holds (the bound is checked per request against it)."""
    await cursor.execute(_PENDING_COUNTS, {"tenants": sorted(tenants)})
    return {row["tenant"]: int(row["n"]) for row in await cursor.fetchall()}


async def expire_pending_rewards(engine: AsyncEngine, older_than_s: float) -> int:
    """Delete pending rewards whose trajectory did not land within `older_than_s` of their arrival."""
    async with engine.connect() as connection:
        pg = await driver_connection(connection)
        async with pg.transaction(), pg.cursor() as cursor:
            await cursor.execute(
                "DELETE FROM rewards WHERE status = 'pending' AND received_at < now() - make_interval(secs => %s)",
                (older_than_s,),
            )
            return cursor.rowcount


# A webhook delivery's signature as it is recorded: (HMAC digest, tenant, signed at unix seconds).
SignatureUse = tuple[bytes, str, float]

# Receives [(position in the batch, policy)] of the rewards whose trajectory is known; raises to refuse.
Checker = Callable[[list[tuple[int, str | None]]], None]

# (policy, name, value, metrics) -> why the policy refuses the reward, or None.
LinkCheck = Callable[[str | None, str, float, dict[str, float]], str | None]


def lock_key(kind: bytes, *parts: str | uuid.UUID) -> int:
    digest = hashlib.blake2b(kind + b"\x00".join(str(p).encode() for p in parts), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def content_hash(reward: NewReward) -> str:
    """What makes two rewards under one idempotency key the same reward (stored: never change the form)."""
    form = [
        reward.target_kind,
        reward.target,
        reward.name,
        reward.value,
        sorted(reward.metrics.items()),
        reward.comment,
        reward.group_id,
        reward.observed_at,
    ]
    return hashlib.sha256(orjson.dumps(form)).hexdigest()


async def _lock(cursor: psycopg.AsyncCursor[Any], keys: set[int]) -> None:
    if keys:
        await cursor.execute("SELECT count(pg_advisory_xact_lock(k)) FROM unnest(%s::bigint[]) AS k", (sorted(keys),))


async def lock_trajectories(cursor: psycopg.AsyncCursor[Any], trajectories: set[uuid.UUID]) -> None:
    """Take the transaction-scoped lock under which a trajectory's rewards change (sorted: no cycles)."""
    await _lock(cursor, {lock_key(b"t", t) for t in trajectories})


class _RootMoved(Exception):
    """A trajectory that rewards were resolved to was merged into another before its lock was held."""


async def _merged_away(cursor: psycopg.AsyncCursor[Any], trajectories: set[uuid.UUID]) -> set[uuid.UUID]:
    """Those of `trajectories` merged into another one (read after their locks are held)."""
    return await (await _send_merged_away(cursor.connection, trajectories))()


# What a statement sent in pipeline mode gives when it is read (the read waits for its round trip).
Pending = Callable[[], Awaitable[T]]


async def _send(
    connection: psycopg.AsyncConnection[Any], query: str, params: Any
) -> psycopg.AsyncCursor[dict[str, Any]]:
    """Send a statement on a cursor of its own, so that its rows can be read after later
    statements were sent (in pipeline mode it waits in the queue until something is read)."""
    cursor = connection.cursor(row_factory=dict_row)
    await cursor.execute(query, params)
    return cursor


async def _rows(cursor: psycopg.AsyncCursor[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of a statement sent by `_send` (its cursor is then closed)."""
    try:
        return await cursor.fetchall()
    finally:
        await cursor.close()


async def _send_merged_away(
    connection: psycopg.AsyncConnection[Any], trajectories: set[uuid.UUID]
) -> Pending[set[uuid.UUID]]:
    if not trajectories:
        return _no_trajectories
    cursor = await _send(
        connection,
        "SELECT id FROM trajectories WHERE id = ANY(%s::uuid[]) AND merged_into IS NOT NULL",
        (list(trajectories),),
    )

    async def read() -> set[uuid.UUID]:
        return {row["id"] for row in await _rows(cursor)}

    return read


async def _no_trajectories() -> set[uuid.UUID]:
    return set()


async def _retrying(
    engine: AsyncEngine,
    work: Callable[[psycopg.AsyncCursor[dict[str, Any]]], Awaitable[T]],
    *,
    pipelined: bool = False,
) -> T:
    """Run `work` in a transaction, again (up to RETRIES times) after a deadlock, a serialization
    failure or a merge that moved a root. `pipelined`: the transaction runs in pipeline mode, so
    BEGIN and every statement sent before the first read share one round trip (see ingest_group)."""
    async with engine.connect() as connection:
        pg = await driver_connection(connection)
        for attempt in range(RETRIES):
            try:
                async with pg.pipeline() if pipelined else nullcontext(), pg.transaction():
                    async with pg.cursor(row_factory=dict_row) as cursor:
                        # JIT compiles these short statements once the tables grow (hundreds of ms).
                        await cursor.execute("SET LOCAL jit = off")
                        return await work(cursor)
            except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure, _RootMoved):
                if attempt == RETRIES - 1:
                    raise
                await asyncio.sleep(0.01 * (attempt + 1))
    raise AssertionError("unreachable: the last attempt returns or raises")


@dataclass(frozen=True, slots=True)
class IntakeRequest:
    """The rewards of one HTTP request (or one judgement): stored all together or refused all together."""

    rewards: Sequence[NewReward]
    check: Checker
    signature: SignatureUse | None = None


@dataclass(frozen=True, slots=True)
class Ingested:
    """A request's answer: its stored rewards in request order, and whether every one of them was
    stored before (under its idempotency key, with the same content)."""

    stored: list[StoredReward]
    replayed: bool


# What one request of a group gets: its answer, or the exception that refuses it (raised by its
# checker, ReplayedSignature, TooManyPending).
Outcome = Ingested | Exception


def store_unavailable(error: BaseException) -> bool:
    """Whether an error says that PostgreSQL could not be reached (or the pool had no connection),
    rather than that a statement failed: a retry later can succeed, and a group need not be split."""
    return isinstance(
        error,
        psycopg.OperationalError | sqlalchemy.exc.OperationalError | sqlalchemy.exc.TimeoutError | OSError,
    )


async def ingest_rewards(
    engine: AsyncEngine,
    rewards: Sequence[NewReward],
    *,
    check: Checker,
    signature: SignatureUse | None = None,
    max_pending: int | None = None,
) -> tuple[list[StoredReward], bool]:
    """Store a batch of rewards in one transaction: all or nothing (raises what refuses it).

    Returns the stored rewards in batch order, and whether every one of them was stored before.
    """
    [outcome] = await ingest_group(engine, [IntakeRequest(rewards, check, signature)], max_pending=max_pending)
    if isinstance(outcome, Exception):
        raise outcome
    return outcome.stored, outcome.replayed


async def ingest_group(
    engine: AsyncEngine, requests: Sequence[IntakeRequest], *, max_pending: int | None = None
) -> list[Outcome]:
    """Store the rewards of several requests in one transaction (group commit), each request all or
    nothing: a request refused by its checker, a replayed signature or the pending bound is left
    out and gets its exception; the others are stored as if they had arrived one after the other,
    in list order. A database error fails the whole transaction (raised).

    The statements are the same whatever the number of requests, so a group of 100 single rewards
    costs about what one costs. They run in pipeline mode, in three round trips (four when the
    pending bound must be counted): BEGIN and the reads that decide what is stored; the writes
    and the answers; COMMIT. Each round trip is a turn of the gateway's event loop, which is what
    a transaction waited on when the same process serves calls (eight turns: rewards' p99 beside
    calls 54 ms; three: 41 ms, docs/benchmarks.md).
    """
    hashes = [[content_hash(reward) for reward in request.rewards] for request in requests]
    keyed = sorted({(r.tenant, r.idempotency_key) for q in requests for r in q.rewards if r.idempotency_key})

    async def work(cursor: psycopg.AsyncCursor[dict[str, Any]]) -> list[Outcome]:
        # Round trip 1 (with BEGIN): signatures, the keys' locks, what is stored under the keys,
        # and the target of every reward (those found stored under their key need none; resolving
        # them too costs a probe each and saves a round trip).
        refused: dict[int, Exception] = {}
        read_signed = await _use_signatures(cursor.connection, requests, refused)
        await _lock(cursor, {lock_key(b"k", tenant, key) for tenant, key in keyed})
        read_existing = await _stored_under_keys(cursor.connection, keyed)
        everything = [(i, j) for i, request in enumerate(requests) for j in range(len(request.rewards))]
        read_resolved = await _resolve(cursor.connection, requests, everything)
        signed = await read_signed()
        existing, key_trajectories = await read_existing()
        resolved = await read_resolved()
        stored_keys = {(tenant, key) for tenant, key, _ in existing}
        candidates = [
            (i, j)
            for i, request in enumerate(requests)
            if i not in refused
            for j, reward in enumerate(request.rewards)
            if not (reward.idempotency_key and (reward.tenant, reward.idempotency_key, hashes[i][j]) in existing)
        ]
        unresolved = {requests[i].rewards[j].tenant for i, j in candidates if resolved[(i, j)][0] is None}
        held: dict[str, int] = {}
        if max_pending is not None and unresolved:
            # Counted under a lock per tenant: two transactions may not both fill the last room.
            await _lock(cursor, {lock_key(b"p", tenant) for tenant in unresolved})
            held = await _pending_held(cursor, unresolved)
        accepted: list[tuple[int, dict[int, uuid.UUID], list[int]]] = []
        for i, request in enumerate(requests):
            if i in refused:
                continue
            answer_ids, fresh, added = _known_and_fresh(request.rewards, hashes[i], existing)
            problem = _refusal(request, [(j, resolved[(i, j)]) for j in fresh], held, max_pending)
            if problem is not None:
                refused[i] = problem
                continue
            existing.update(added)
            accepted.append((i, answer_ids, fresh))
        released = [use[0] for i in signed if i in refused and (use := requests[i].signature) is not None]
        fresh_rewards = [(i, j) for i, _, fresh in accepted for j in fresh]
        # Round trip 2: every statement from here on is known; the merge check is read last (a
        # root merged meanwhile rolls the whole transaction back and it starts over). Then COMMIT.
        if released:  # a refused delivery can be retried with the same signature
            await cursor.execute("DELETE FROM reward_signatures WHERE signature = ANY(%s::bytea[])", (released,))
        read_moved = None
        if fresh_rewards:
            read_moved = await _insert(cursor, requests, hashes, fresh_rewards, resolved, key_trajectories, stored_keys)
        read_stored = await _read_rewards(
            cursor.connection, {reward_id for _, ids, _ in accepted for reward_id in ids.values()}
        )
        if read_moved is not None and await read_moved():
            raise _RootMoved()  # the transaction starts over and resolves the new root
        stored = await read_stored()
        answers: dict[int, Outcome] = dict(refused)
        for i, answer_ids, fresh in accepted:
            rewards = [stored[answer_ids[j]] for j in range(len(requests[i].rewards))]
            answers[i] = Ingested(rewards, replayed=not fresh)
        return [answers[i] for i in range(len(requests))]

    return await _retrying(engine, work, pipelined=True)


async def _use_signatures(
    connection: psycopg.AsyncConnection[Any], requests: Sequence[IntakeRequest], refused: dict[int, Exception]
) -> Pending[list[int]]:
    """Record the webhook signatures in the rewards' transaction (a failed delivery can be retried);
    a signature recorded before, or twice in the group, refuses its request. The read returns the
    requests whose signature this transaction recorded (and adds the refused ones to `refused`)."""
    first: dict[bytes, int] = {}
    for i, request in enumerate(requests):
        if request.signature is not None:
            if request.signature[0] in first:
                refused[i] = ReplayedSignature()
            else:
                first[request.signature[0]] = i
    if not first:
        return _nothing_signed
    uses = [use for i in first.values() if (use := requests[i].signature) is not None]
    cursor = await _send(
        connection,
        "INSERT INTO reward_signatures (signature, tenant, signed_at) "
        "SELECT s, t, to_timestamp(at) FROM unnest(%s::bytea[], %s::text[], %s::float8[]) AS u(s, t, at) "
        "ON CONFLICT DO NOTHING RETURNING signature",
        ([use[0] for use in uses], [use[1] for use in uses], [use[2] for use in uses]),
    )

    async def read() -> list[int]:
        recorded = {bytes(row["signature"]) for row in await _rows(cursor)}
        for digest, i in first.items():
            if digest not in recorded:
                refused[i] = ReplayedSignature()
        return [i for digest, i in first.items() if digest in recorded]

    return read


async def _nothing_signed() -> list[int]:
    return []


async def _stored_under_keys(
    connection: psycopg.AsyncConnection[Any],
    keyed: list[tuple[str, str]],
) -> Pending[tuple[dict[tuple[str, str, str], uuid.UUID], set[uuid.UUID]]]:
    """The rewards already stored under these (tenant, idempotency key)s, by (tenant, key, content hash),
    and the trajectories they are linked to."""
    cursor = (
        await _send(connection, _EXISTING_KEYS, {"tenants": [t for t, _ in keyed], "keys": [k for _, k in keyed]})
        if keyed
        else None
    )

    async def read() -> tuple[dict[tuple[str, str, str], uuid.UUID], set[uuid.UUID]]:
        existing: dict[tuple[str, str, str], uuid.UUID] = {}
        trajectories: set[uuid.UUID] = set()
        for row in await _rows(cursor) if cursor is not None else []:
            existing[(row["tenant"], row["idempotency_key"], row["content_hash"].hex())] = row["id"]
            if row["trajectory_id"]:
                trajectories.add(row["trajectory_id"])
        return existing, trajectories

    return read


def _known_and_fresh(
    rewards: Sequence[NewReward], hashes: list[str], existing: dict[tuple[str, str, str], uuid.UUID]
) -> tuple[dict[int, uuid.UUID], list[int], dict[tuple[str, str, str], uuid.UUID]]:
    """The id that answers each position, the positions to insert, and the keyed slots they add
    (for `existing` once the request is accepted): a key repeated with the same content (stored
    before, earlier in the group, or earlier in this request) is stored once."""
    answer_ids: dict[int, uuid.UUID] = {}
    fresh: list[int] = []
    added: dict[tuple[str, str, str], uuid.UUID] = {}
    for position, reward in enumerate(rewards):
        slot = (reward.tenant, reward.idempotency_key or "", hashes[position])
        known = (existing.get(slot) or added.get(slot)) if reward.idempotency_key else None
        if known is not None:
            answer_ids[position] = known
            continue
        fresh.append(position)
        answer_ids[position] = reward.id
        if reward.idempotency_key:
            added[slot] = reward.id
    return answer_ids, fresh, added


# (trajectory, policy) of a reward's target when it is stored; (None, None) when it is not.
Resolved = tuple[uuid.UUID | None, str | None]


async def _resolve(
    connection: psycopg.AsyncConnection[Any], requests: Sequence[IntakeRequest], positions: list[tuple[int, int]]
) -> Pending[dict[tuple[int, int], Resolved]]:
    """The stored trajectory (root, after merges) and policy that each reward's target names."""
    items = []
    for ord_, (i, j) in enumerate(positions):
        reward = requests[i].rewards[j]
        items.append(
            {
                "ord": ord_,
                "tenant": reward.tenant,
                "target_trajectory_id": reward.target_trajectory_id,
                "target_call": reward.target_call,
            }
        )
    by_trajectory_only = all(item["target_trajectory_id"] is not None for item in items)
    query = _RESOLVE_TRAJECTORIES if by_trajectory_only else _RESOLVE
    cursor = await _send(connection, query, {"items": orjson.dumps(items).decode()}) if items else None

    async def read() -> dict[tuple[int, int], Resolved]:
        found = await _rows(cursor) if cursor is not None else []
        rows = {row["ord"]: (row["trajectory_id"], row["policy"]) for row in found}
        return {position: rows.get(ord_, (None, None)) for ord_, position in enumerate(positions)}

    return read


def _refusal(
    request: IntakeRequest,
    fresh: list[tuple[int, Resolved]],
    held: dict[str, int],
    max_pending: int | None,
) -> Exception | None:
    """Why the request is refused (its checker, on the fresh rewards whose policy is known; then the
    pending bound), or None; an accepted request's pending rewards are added to `held`."""
    try:
        request.check([(j, policy) for j, (trajectory, policy) in fresh if trajectory is not None])
    except Exception as refusal:  # the checker's error is the request's answer
        return refusal
    adding: dict[str, int] = {}
    for j, (trajectory, _) in fresh:
        if trajectory is None:
            tenant = request.rewards[j].tenant
            adding[tenant] = adding.get(tenant, 0) + 1
    if max_pending is not None:
        for tenant, count in sorted(adding.items()):
            if held.get(tenant, 0) + count > max_pending:
                return TooManyPending(tenant, held.get(tenant, 0), count, max_pending)
    for tenant, count in adding.items():
        held[tenant] = held.get(tenant, 0) + count
    return None


async def _insert(
    cursor: psycopg.AsyncCursor[dict[str, Any]],
    requests: Sequence[IntakeRequest],
    hashes: list[list[str]],
    fresh: list[tuple[int, int]],
    resolved: dict[tuple[int, int], Resolved],
    key_trajectories: set[uuid.UUID],
    stored_keys: set[tuple[str, str]],
) -> Pending[set[uuid.UUID]]:
    """Insert the fresh rewards (in group order) and bring the current rewards and groups of every
    trajectory they touch up to date: in one statement when no key of theirs was stored before
    (`_INSERT_CURRENT`), else by re-deriving the slots and keys they touch (`_RECOMPUTE`).
    `stored_keys` are the (tenant, key)s that had rows before this transaction.

    The read returns the trajectories merged away before their locks were held: when there is
    one, the caller must roll the transaction back (the rows went to a child no reader looks at);
    checked after the statements are sent, so that they share the check's round trip."""
    trajectories = {t for position in fresh if (t := resolved[position][0]) is not None}
    await lock_trajectories(cursor, trajectories | key_trajectories)
    read_moved = await _send_merged_away(cursor.connection, trajectories)
    rows = [
        _insert_row(ord_, requests[i].rewards[j], hashes[i][j], resolved[(i, j)][0])
        for ord_, (i, j) in enumerate(fresh)
    ]
    new_keys = [(r.tenant, r.idempotency_key) for r in (requests[i].rewards[j] for i, j in fresh) if r.idempotency_key]
    if not key_trajectories and len(set(new_keys)) == len(new_keys) and stored_keys.isdisjoint(new_keys):
        await cursor.execute(_INSERT_CURRENT, {"rows": orjson.dumps(rows).decode()})
    else:
        await cursor.execute(_INSERT, {"rows": orjson.dumps(rows).decode()})
        await _recompute(cursor, trajectories, sorted(set(new_keys)))
    if trajectories and any(requests[i].rewards[j].group_id for i, j in fresh):
        await cursor.execute(_GROUPS_GIVEN, {"trajectories": list(trajectories)})
    return read_moved


async def _recompute(
    cursor: psycopg.AsyncCursor[dict[str, Any]], trajectories: set[uuid.UUID], keys: list[tuple[str, str]]
) -> None:
    """Re-derive superseded_at for the rewards of these trajectories and keys (`_RECOMPUTE`)."""
    await cursor.execute(
        _RECOMPUTE_GIVEN,
        {"trajectories": list(trajectories), "tenants": [t for t, _ in keys], "keys": [k for _, k in keys]},
    )


def _insert_row(position: int, reward: NewReward, hash_: str, trajectory_id: uuid.UUID | None) -> dict[str, Any]:
    """The record `_INSERT` reads (jsonb_to_recordset): its keys are the columns it declares."""
    return {
        "ord": position,
        "id": reward.id,
        "tenant": reward.tenant,
        "target_kind": reward.target_kind,
        "target": reward.target,
        "target_trajectory_id": reward.target_trajectory_id,
        "target_call": reward.target_call,
        "trajectory_id": trajectory_id,
        "name": reward.name,
        "value": reward.value,
        "metrics": reward.metrics,
        "comment": reward.comment,
        "group_id": reward.group_id,
        "idempotency_key": reward.idempotency_key,
        "content_hash": hash_,
        "source": reward.source,
        "api_key_id": reward.api_key_id,
        "observed_at": reward.observed_at,
        "judgement_id": reward.judgement_id,
    }


async def _read_rewards(
    connection: psycopg.AsyncConnection[Any], ids: set[uuid.UUID]
) -> Pending[dict[uuid.UUID, StoredReward]]:
    cursor = await _send(connection, _ANSWERS, {"ids": list(ids)})

    async def read() -> dict[uuid.UUID, StoredReward]:
        return {row["id"]: StoredReward(**row) for row in await _rows(cursor)}

    return read


async def link_pending_rewards(
    engine: AsyncEngine, check: LinkCheck, *, window_s: float, include_overdue: bool = False, limit: int = 5000
) -> int:
    """Link pending rewards whose trajectory has landed; returns how many were linked.

    `check(policy, name, value, metrics)` returns a reason when the trajectory's policy
    refuses the reward: it is then stored as 'rejected' (reported, never current).
    """

    async def work(cursor: psycopg.AsyncCursor[dict[str, Any]]) -> int:
        await cursor.execute(_PENDING_CANDIDATES, {"all": include_overdue, "window_s": window_s, "limit": limit})
        candidates = await cursor.fetchall()
        if not candidates:
            return 0
        await _lock(
            cursor, {lock_key(b"k", c["tenant"], c["idempotency_key"]) for c in candidates if c["idempotency_key"]}
        )
        roots = {c["root"] for c in candidates}
        await lock_trajectories(cursor, roots)
        moved = await _merged_away(cursor, roots)
        if moved:  # merged after the candidates were read: linked to the new root on the next pass
            candidates = [c for c in candidates if c["root"] not in moved]
            roots -= moved
        links = []
        for c in candidates:
            reason = check(c["policy"], c["name"], c["value"], c["metrics"] or {})
            links.append(
                {
                    "id": str(c["id"]),
                    "root": str(c["root"]),
                    "status": "rejected" if reason else "linked",
                    "reason": reason,
                }
            )
        await cursor.execute(_LINK, {"links": orjson.dumps(links).decode()})
        linked = cursor.rowcount
        await _recompute(cursor, roots, [])
        await cursor.execute(_GROUPS_GIVEN, {"trajectories": list(roots)})
        return linked

    return await _retrying(engine, work)


async def forget_old_signatures(engine: AsyncEngine, older_than_s: float) -> int:
    async with engine.begin() as connection:
        pg = await driver_connection(connection)
        async with pg.cursor() as cursor:
            await cursor.execute(
                "DELETE FROM reward_signatures WHERE signed_at < now() - make_interval(secs => %s)", (older_than_s,)
            )
            return cursor.rowcount


async def list_unlinked(
    engine: AsyncEngine, *, tenant: str | None, window_s: float, statuses: list[str], overdue_only: bool, limit: int
) -> UnlinkedRewards:
    params = {
        "tenant": tenant,
        "window_s": window_s,
        "statuses": statuses,
        "overdue_only": overdue_only,
        "limit": limit + 1,
    }
    async with engine.connect() as connection:
        pg = await driver_connection(connection)
        async with pg.cursor(row_factory=dict_row) as cursor:
            await cursor.execute(_UNLINKED_LIST, params)
            rows = await cursor.fetchall()
            await cursor.execute(_UNLINKED_COUNTS, params)
            counts = await cursor.fetchone()
        await pg.commit()
    assert counts is not None  # an aggregate without GROUP BY answers one row
    return UnlinkedRewards(
        rewards=[UnlinkedReward(**row) for row in rows[:limit]],
        pending_count=counts["pending"],
        overdue_count=counts["overdue"],
        rejected_count=counts["rejected"],
        has_more=len(rows) > limit,
    )


async def rewards_of(
    cursor: psycopg.AsyncCursor[dict[str, Any]], trajectory_ids: list[uuid.UUID], *, history: bool
) -> list[StoredReward]:
    """The current rewards of these trajectories (with `history`: every one), by name, oldest first."""
    condition = "" if history else "AND r.status = 'linked' AND r.superseded_at IS NULL"
    await cursor.execute(
        f"SELECT {_REWARD_COLUMNS} FROM rewards r WHERE r.trajectory_id = ANY(%(ids)s::uuid[]) "
        f"{condition} ORDER BY r.name, r.observed_at, r.seq",
        {"ids": trajectory_ids},
    )
    return [StoredReward(**row) for row in await cursor.fetchall()]


async def get_reward(engine: AsyncEngine, reward_id: uuid.UUID, tenant: str | None) -> StoredReward | None:
    """A reward by id; with `tenant`, only if it is that tenant's."""
    async with engine.connect() as connection:
        pg = await driver_connection(connection)
        async with pg.cursor(row_factory=dict_row) as cursor:
            await cursor.execute(
                f"SELECT {_REWARD_COLUMNS} FROM rewards r WHERE r.id = %(id)s "
                "AND (%(tenant)s::text IS NULL OR r.tenant = %(tenant)s)",
                {"id": reward_id, "tenant": tenant},
            )
            row = await cursor.fetchone()
        await pg.commit()
    return StoredReward(**row) if row else None
