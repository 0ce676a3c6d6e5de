"""Rewards in PostgreSQL: set-based intake, linking of pending rewards, and "current" upkeep.

Every accepted reward is a row; nothing is deleted. A row is *current* (status 'linked',
superseded_at NULL) when it is the latest of its trajectory and name, where "latest" is the
greatest (observed_at, seq) among the rows that are themselves the latest of their
idempotency key. That is a pure function of the set of rows, so the outcome does not depend
on the order in which duplicates, replays and late rewards arrive: `_RECOMPUTE` re-derives
superseded_at for the trajectories and keys a transaction touched.

Concurrency: writers take transaction-scoped advisory locks, first on the idempotency keys
of their batch, then on every trajectory whose rewards they may change, each set in sorted
order (so no two writers wait on each other in a cycle). The linker takes the same locks.
A deadlock with the call shipper's row locks is possible in principle; the transaction is
then retried.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import orjson
import psycopg
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

# The trajectory a target names, if stored: a call by its uuid or response id (newest when
# several calls of the tenant share one), then the root of a merged trajectory.
_RESOLVE = (
    """
SELECT i.ord, rt.id AS trajectory_id, rt.policy
FROM jsonb_to_recordset(%(items)s::jsonb) AS i(ord int, tenant text, target_trajectory_id uuid, target_call text)
CROSS JOIN LATERAL (SELECT coalesce(
    i.target_trajectory_id,
    (SELECT c.trajectory_id FROM calls c
     WHERE c.id = """
    + _CALL_UUID.format(col="i.target_call")
    + """ AND c.tenant = i.tenant),
    (SELECT c.trajectory_id FROM calls c WHERE c.response_id = i.target_call AND c.tenant = i.tenant
     ORDER BY c.created_at DESC LIMIT 1)) AS tid) x
LEFT JOIN trajectories t ON t.id = x.tid AND t.tenant = i.tenant
LEFT JOIN trajectories rt ON rt.id = coalesce(t.merged_into, t.id)
"""
)

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

# Re-derive superseded_at for the rewards of some trajectories ({trajectories}: a query of
# uuids) and of some idempotency keys ({keys}: a query of (tenant, k)), including every
# trajectory that a row of those keys is linked to.
_K_LATEST = """({r}.idempotency_key IS NULL OR NOT EXISTS (
    SELECT 1 FROM rewards o WHERE o.tenant = {r}.tenant AND o.idempotency_key = {r}.idempotency_key
    AND (o.observed_at, o.seq) > ({r}.observed_at, {r}.seq)))"""

# The slots (trajectory, name) that may change are those holding a current row, plus those of
# the keys' rows; each slot's winner is found by walking ix_rewards_slot from the newest row
# (history never has to be scanned), and only current rows, winners and the keys' rows are
# candidates for a change.
_RECOMPUTE = (
    """
WITH kg AS (
    SELECT r.id, r.trajectory_id, r.name FROM rewards r JOIN ({keys}) AS q(tenant, k)
    ON r.tenant = q.tenant AND r.idempotency_key = q.k
), trajs AS (
    {trajectories} UNION SELECT trajectory_id FROM kg WHERE trajectory_id IS NOT NULL
), slots AS (
    SELECT r.trajectory_id, r.name FROM rewards r
    WHERE r.trajectory_id IN (SELECT * FROM trajs) AND r.status = 'linked' AND r.superseded_at IS NULL
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
    SELECT r.id FROM rewards r JOIN slots s ON r.trajectory_id = s.trajectory_id AND r.name = s.name
    WHERE r.status = 'linked' AND r.superseded_at IS NULL
    UNION SELECT id FROM win
    UNION SELECT id FROM kg
), decided AS (
    SELECT c.id, c.superseded_at,
           (c.id IN (SELECT id FROM win) OR (c.status = 'pending' AND """
    + _K_LATEST.format(r="c")
    + """)) AS keep
    FROM rewards c JOIN cand USING (id)
)
UPDATE rewards u SET superseded_at = CASE WHEN d.keep THEN NULL ELSE now() END
FROM decided d WHERE u.id = d.id AND d.keep = (d.superseded_at IS NOT NULL)
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

_PENDING_CANDIDATES = (
    """
SELECT r.id, r.tenant, r.idempotency_key, rt.id AS root, rt.policy, r.name, r.value, r.metrics
FROM rewards r
CROSS JOIN LATERAL (SELECT coalesce(
    r.target_trajectory_id,
    (SELECT c.trajectory_id FROM calls c
     WHERE c.id = """
    + _CALL_UUID.format(col="r.target_call")
    + """ AND c.tenant = r.tenant),
    (SELECT c.trajectory_id FROM calls c WHERE c.response_id = r.target_call AND c.tenant = r.tenant
     ORDER BY c.created_at DESC LIMIT 1)) AS tid) x
JOIN trajectories t ON t.id = x.tid AND t.tenant = r.tenant
JOIN trajectories rt ON rt.id = coalesce(t.merged_into, t.id)
WHERE r.status = 'pending' AND (%(all)s OR r.received_at > now() - make_interval(secs => %(window_s)s))
ORDER BY r.received_at
LIMIT %(limit)s
"""
)

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


async def _refuse_too_many_pending(
    cursor: psycopg.AsyncCursor[dict[str, Any]], adding: dict[str, int], limit: int | None
) -> None:
    if limit is None or not adding:
        return
    await cursor.execute(_PENDING_COUNTS, {"tenants": sorted(adding)})
    held = {row["tenant"]: int(row["n"]) for row in await cursor.fetchall()}
    for tenant, count in sorted(adding.items()):
        if held.get(tenant, 0) + count > limit:
            raise TooManyPending(tenant, held.get(tenant, 0), count, limit)


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


async def _retrying(engine: AsyncEngine, work: Callable[[psycopg.AsyncCursor[dict[str, Any]]], Awaitable[T]]) -> T:
    async with engine.connect() as connection:
        pg = await driver_connection(connection)
        for attempt in range(RETRIES):
            try:
                async with pg.transaction():
                    async with pg.cursor(row_factory=dict_row) as cursor:
                        # JIT compiles these short statements once the tables grow (hundreds of ms).
                        await cursor.execute("SET LOCAL jit = off")
                        return await work(cursor)
            except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure):
                if attempt == RETRIES - 1:
                    raise
                await asyncio.sleep(0.01 * (attempt + 1))
    raise AssertionError("unreachable: the last attempt returns or raises")


async def ingest_rewards(
    engine: AsyncEngine,
    rewards: Sequence[NewReward],
    *,
    check: Checker,
    signature: SignatureUse | None = None,
    max_pending: int | None = None,
) -> tuple[list[StoredReward], bool]:
    """Store a batch of rewards in one transaction: all or nothing.

    Returns the stored rewards in batch order, and whether every one of them was stored before
    (under its idempotency key, with the same content).
    """
    hashes = [content_hash(reward) for reward in rewards]
    keyed = sorted({(r.tenant, r.idempotency_key) for r in rewards if r.idempotency_key})

    async def work(cursor: psycopg.AsyncCursor[dict[str, Any]]) -> tuple[list[StoredReward], bool]:
        if signature is not None:
            await _use_signature(cursor, signature)
        await _lock(cursor, {lock_key(b"k", tenant, key) for tenant, key in keyed})
        existing, key_trajectories = await _stored_under_keys(cursor, keyed)
        answer_ids, fresh = _known_and_fresh(rewards, hashes, existing)
        if fresh:
            await _insert(cursor, rewards, hashes, fresh, key_trajectories, check, max_pending)
        stored = await _read_rewards(cursor, set(answer_ids.values()))
        return [stored[answer_ids[position]] for position in range(len(rewards))], not fresh

    return await _retrying(engine, work)


async def _use_signature(cursor: psycopg.AsyncCursor[dict[str, Any]], signature: SignatureUse) -> None:
    """Record a webhook signature, in the rewards' transaction: a failed delivery can be retried."""
    await cursor.execute(
        "INSERT INTO reward_signatures (signature, tenant, signed_at) VALUES (%s, %s, to_timestamp(%s)) "
        "ON CONFLICT DO NOTHING RETURNING 1",
        signature,
    )
    if await cursor.fetchone() is None:
        raise ReplayedSignature()


async def _stored_under_keys(
    cursor: psycopg.AsyncCursor[dict[str, Any]],
    keyed: list[tuple[str, str]],
) -> tuple[dict[tuple[str, str, str], uuid.UUID], set[uuid.UUID]]:
    """The rewards already stored under these (tenant, idempotency key)s, by (tenant, key, content hash),
    and the trajectories they are linked to."""
    existing: dict[tuple[str, str, str], uuid.UUID] = {}
    trajectories: set[uuid.UUID] = set()
    if keyed:
        await cursor.execute(_EXISTING_KEYS, {"tenants": [t for t, _ in keyed], "keys": [k for _, k in keyed]})
        for row in await cursor.fetchall():
            existing[(row["tenant"], row["idempotency_key"], row["content_hash"].hex())] = row["id"]
            if row["trajectory_id"]:
                trajectories.add(row["trajectory_id"])
    return existing, trajectories


def _known_and_fresh(
    rewards: Sequence[NewReward], hashes: list[str], existing: dict[tuple[str, str, str], uuid.UUID]
) -> tuple[dict[int, uuid.UUID], list[int]]:
    """The id that answers each position, and the positions to insert: a key repeated with the same
    content (stored before, or earlier in this batch) is stored once."""
    answer_ids: dict[int, uuid.UUID] = {}
    fresh: list[int] = []
    for position, reward in enumerate(rewards):
        slot = (reward.tenant, reward.idempotency_key or "", hashes[position])
        known = existing.get(slot) if reward.idempotency_key else None
        if known is not None:
            answer_ids[position] = known
            continue
        fresh.append(position)
        answer_ids[position] = reward.id
        if reward.idempotency_key:
            existing[slot] = reward.id
    return answer_ids, fresh


async def _insert(
    cursor: psycopg.AsyncCursor[dict[str, Any]],
    rewards: Sequence[NewReward],
    hashes: list[str],
    fresh: list[int],
    key_trajectories: set[uuid.UUID],
    check: Checker,
    max_pending: int | None = None,
) -> None:
    """Resolve the fresh rewards' trajectories, let `check` refuse the batch (and the pending
    bound), insert, and bring the current rewards and groups of every trajectory they touch up to date."""
    await cursor.execute(
        _RESOLVE,
        {
            "items": orjson.dumps(
                [
                    {
                        "ord": position,
                        "tenant": rewards[position].tenant,
                        "target_trajectory_id": rewards[position].target_trajectory_id,
                        "target_call": rewards[position].target_call,
                    }
                    for position in fresh
                ]
            ).decode()
        },
    )
    resolved: dict[int, uuid.UUID | None] = {}
    policies: list[tuple[int, str | None]] = []
    for row in await cursor.fetchall():
        resolved[row["ord"]] = row["trajectory_id"]
        if row["trajectory_id"]:
            policies.append((row["ord"], row["policy"]))
    check(policies)
    adding: dict[str, int] = {}
    for position in fresh:
        if resolved.get(position) is None:
            adding[rewards[position].tenant] = adding.get(rewards[position].tenant, 0) + 1
    await _refuse_too_many_pending(cursor, adding, max_pending)
    trajectories = {trajectory for trajectory in resolved.values() if trajectory}
    await _lock(cursor, {lock_key(b"t", t) for t in trajectories | key_trajectories})
    rows = [_insert_row(position, rewards[position], hashes[position], resolved[position]) for position in fresh]
    await cursor.execute(_INSERT, {"rows": orjson.dumps(rows).decode()})
    new_keys = sorted({(rewards[p].tenant, rewards[p].idempotency_key) for p in fresh if rewards[p].idempotency_key})
    await cursor.execute(
        _RECOMPUTE_GIVEN,
        {"trajectories": list(trajectories), "tenants": [t for t, _ in new_keys], "keys": [k for _, k in new_keys]},
    )
    if trajectories and any(rewards[position].group_id for position in fresh):
        await cursor.execute(_GROUPS_GIVEN, {"trajectories": list(trajectories)})


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
    cursor: psycopg.AsyncCursor[dict[str, Any]], ids: set[uuid.UUID]
) -> dict[uuid.UUID, StoredReward]:
    await cursor.execute(_ANSWERS, {"ids": list(ids)})
    return {row["id"]: StoredReward(**row) for row in await cursor.fetchall()}


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
        await _lock(cursor, {lock_key(b"t", root) for root in roots})
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
        params = {"trajectories": list(roots), "tenants": [], "keys": []}
        await cursor.execute(_RECOMPUTE_GIVEN, params)
        await cursor.execute(_GROUPS_GIVEN, params)
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
