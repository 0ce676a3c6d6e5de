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
from collections.abc import Callable, Sequence
from typing import Any

import orjson
import psycopg
from psycopg.rows import dict_row
from sqlalchemy.ext.asyncio import AsyncEngine

RETRIES = 5

_REWARD_COLUMNS = """r.id, r.status, r.trajectory_id, r.target_kind, r.target, r.name, r.value, r.metrics,
    r.comment, r.group_id, r.idempotency_key, r.observed_at, r.received_at, r.linked_at,
    r.superseded_at, r.reject_reason"""

_EXISTING_KEYS = """
SELECT r.tenant, r.idempotency_key, r.content_hash, r.id, r.trajectory_id
FROM rewards r
JOIN unnest(%(tenants)s::text[], %(keys)s::text[]) AS q(tenant, k) ON r.tenant = q.tenant AND r.idempotency_key = q.k
"""

_CALL_UUID = "CASE WHEN {col} ~* '^[0-9a-f]{{8}}-[0-9a-f]{{4}}-[0-9a-f]{{4}}-[0-9a-f]{{4}}-[0-9a-f]{{12}}$' THEN {col}::uuid END"

# The trajectory a target names, if stored: a call by its uuid or response id (newest when
# several calls of the tenant share one), then the root of a merged trajectory.
_RESOLVE = """
SELECT i.ord, rt.id AS trajectory_id, rt.policy
FROM jsonb_to_recordset(%(items)s::jsonb) AS i(ord int, tenant text, target_trajectory_id uuid, target_call text)
CROSS JOIN LATERAL (SELECT coalesce(
    i.target_trajectory_id,
    (SELECT c.trajectory_id FROM calls c
     WHERE c.id = """ + _CALL_UUID.format(col="i.target_call") + """ AND c.tenant = i.tenant),
    (SELECT c.trajectory_id FROM calls c WHERE c.response_id = i.target_call AND c.tenant = i.tenant
     ORDER BY c.created_at DESC LIMIT 1)) AS tid) x
LEFT JOIN trajectories t ON t.id = x.tid AND t.tenant = i.tenant
LEFT JOIN trajectories rt ON rt.id = coalesce(t.merged_into, t.id)
"""

_INSERT = """
INSERT INTO rewards (id, tenant, target_kind, target, target_trajectory_id, target_call, trajectory_id, status,
                     linked_at, name, value, metrics, comment, group_id, idempotency_key, content_hash, source,
                     api_key_id, observed_at)
SELECT i.id, i.tenant, i.target_kind, i.target, i.target_trajectory_id, i.target_call, i.trajectory_id,
       CASE WHEN i.trajectory_id IS NULL THEN 'pending' ELSE 'linked' END,
       CASE WHEN i.trajectory_id IS NULL THEN NULL ELSE now() END,
       i.name, i.value, coalesce(i.metrics, '{}'::jsonb), i.comment, i.group_id, i.idempotency_key,
       decode(i.content_hash, 'hex'), i.source, i.api_key_id, coalesce(to_timestamp(i.observed_at), now())
FROM jsonb_to_recordset(%(rows)s::jsonb) AS i(
    ord int, id uuid, tenant text, target_kind text, target text, target_trajectory_id uuid, target_call text,
    trajectory_id uuid, name text, value float8, metrics jsonb, comment text, group_id text,
    idempotency_key text, content_hash text, source text, api_key_id uuid, observed_at float8)
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
_RECOMPUTE = """
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
          AND """ + _K_LATEST.format(r="r") + """
        ORDER BY r.observed_at DESC, r.seq DESC LIMIT 1) w
), cand AS (
    SELECT r.id FROM rewards r JOIN slots s ON r.trajectory_id = s.trajectory_id AND r.name = s.name
    WHERE r.status = 'linked' AND r.superseded_at IS NULL
    UNION SELECT id FROM win
    UNION SELECT id FROM kg
), decided AS (
    SELECT c.id, c.superseded_at,
           (c.id IN (SELECT id FROM win) OR (c.status = 'pending' AND """ + _K_LATEST.format(r="c") + """)) AS keep
    FROM rewards c JOIN cand USING (id)
)
UPDATE rewards u SET superseded_at = CASE WHEN d.keep THEN NULL ELSE now() END
FROM decided d WHERE u.id = d.id AND d.keep = (d.superseded_at IS NOT NULL)
"""

_RECOMPUTE_GIVEN = _RECOMPUTE.format(
    keys="SELECT * FROM unnest(%(tenants)s::text[], %(keys)s::text[])",
    trajectories="SELECT unnest(%(trajectories)s::uuid[])")

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
    _RECOMPUTE.format(keys="SELECT NULL::text, NULL::text WHERE false",
                      trajectories="SELECT parent FROM merges"),
    _GROUPS.format(trajectories="SELECT parent FROM merges"),
]

_PENDING_CANDIDATES = """
SELECT r.id, r.tenant, r.idempotency_key, rt.id AS root, rt.policy, r.name, r.value, r.metrics
FROM rewards r
CROSS JOIN LATERAL (SELECT coalesce(
    r.target_trajectory_id,
    (SELECT c.trajectory_id FROM calls c
     WHERE c.id = """ + _CALL_UUID.format(col="r.target_call") + """ AND c.tenant = r.tenant),
    (SELECT c.trajectory_id FROM calls c WHERE c.response_id = r.target_call AND c.tenant = r.tenant
     ORDER BY c.created_at DESC LIMIT 1)) AS tid) x
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


class ReplayedSignature(Exception):
    """The webhook signature was accepted before."""


def lock_key(kind: bytes, *parts: str | uuid.UUID) -> int:
    digest = hashlib.blake2b(kind + b"\x00".join(str(p).encode() for p in parts), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def content_hash(item: dict[str, Any]) -> str:
    """What makes two rewards under one idempotency key the same reward."""
    form = [item["target_kind"], item["target"], item["name"], item["value"], sorted((item["metrics"] or {}).items()),
            item["comment"], item["group_id"], item["observed_at"]]
    return hashlib.sha256(orjson.dumps(form)).hexdigest()


def answer(row: dict[str, Any]) -> dict[str, Any]:
    """A stored reward as the API shows it (RewardOut)."""
    return {
        "id": str(row["id"]), "object": "reward", "status": row["status"],
        "current": row["status"] == "linked" and row["superseded_at"] is None,
        "trajectory_id": str(row["trajectory_id"]) if row["trajectory_id"] else None,
        "target_kind": row["target_kind"], "target": row["target"], "name": row["name"], "reward": row["value"],
        "metrics": row["metrics"] or {}, "comment": row["comment"], "group_id": row["group_id"],
        "idempotency_key": row["idempotency_key"], "observed_at": row["observed_at"],
        "received_at": row["received_at"], "linked_at": row["linked_at"], "superseded_at": row["superseded_at"],
        "reject_reason": row["reject_reason"],
    }


async def _driver_connection(connection: Any) -> psycopg.AsyncConnection:
    raw = await connection.get_raw_connection()
    return raw.driver_connection


async def _lock(cursor: psycopg.AsyncCursor, keys: set[int]) -> None:
    if keys:
        await cursor.execute("SELECT count(pg_advisory_xact_lock(k)) FROM unnest(%s::bigint[]) AS k",
                             (sorted(keys),))


async def _retrying(engine: AsyncEngine, work: Callable[[psycopg.AsyncCursor], Any]) -> Any:
    async with engine.connect() as connection:
        pg = await _driver_connection(connection)
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


Checker = Callable[[list[tuple[int, str | None]]], None]


async def ingest_rewards(engine: AsyncEngine, items: Sequence[dict[str, Any]], *, check: Checker,
                         signature: tuple[bytes, str, float] | None = None) -> tuple[list[dict[str, Any]], bool]:
    """Store a batch of rewards in one transaction: all or nothing.

    `items` are dicts with the columns of `_INSERT` (ord = position in the batch) plus
    `target_call` text. `check` receives [(ord, policy)] of the items whose trajectory is
    known and raises to refuse the batch. Returns (answers in batch order, all_replayed).
    """

    async def work(cursor: psycopg.AsyncCursor) -> tuple[list[dict[str, Any]], bool]:
        if signature is not None:
            await cursor.execute(
                "INSERT INTO reward_signatures (signature, tenant, signed_at) VALUES (%s, %s, to_timestamp(%s)) "
                "ON CONFLICT DO NOTHING RETURNING 1", signature)
            if await cursor.fetchone() is None:
                raise ReplayedSignature()
        keyed = sorted({(i["tenant"], i["idempotency_key"]) for i in items if i["idempotency_key"]})
        await _lock(cursor, {lock_key(b"k", tenant, key) for tenant, key in keyed})
        existing: dict[tuple[str, str, str], uuid.UUID] = {}
        key_trajectories: set[uuid.UUID] = set()
        if keyed:
            await cursor.execute(_EXISTING_KEYS, {"tenants": [t for t, _ in keyed], "keys": [k for _, k in keyed]})
            for row in await cursor.fetchall():
                existing[(row["tenant"], row["idempotency_key"], row["content_hash"].hex())] = row["id"]
                if row["trajectory_id"]:
                    key_trajectories.add(row["trajectory_id"])
        answer_ids: dict[int, uuid.UUID] = {}
        fresh: list[dict[str, Any]] = []
        for item in items:  # a key repeated with the same content within the batch is stored once
            slot = (item["tenant"], item["idempotency_key"], item["content_hash"])
            known = existing.get(slot) if item["idempotency_key"] else None
            if known is not None:
                answer_ids[item["ord"]] = known
            else:
                fresh.append(item)
                if item["idempotency_key"]:
                    existing[slot] = uuid.UUID(item["id"])
        if fresh:
            await cursor.execute(_RESOLVE, {"items": orjson.dumps([
                {"ord": i["ord"], "tenant": i["tenant"], "target_trajectory_id": i["target_trajectory_id"],
                 "target_call": i["target_call"]} for i in fresh]).decode()})
            resolved = {row["ord"]: row for row in await cursor.fetchall()}
            check([(ord_, row["policy"]) for ord_, row in resolved.items() if row["trajectory_id"]])
            trajectories = {row["trajectory_id"] for row in resolved.values() if row["trajectory_id"]}
            new_keys = sorted({(i["tenant"], i["idempotency_key"]) for i in fresh if i["idempotency_key"]})
            await _lock(cursor, {lock_key(b"t", t) for t in trajectories | key_trajectories})
            rows = []
            for item in fresh:
                trajectory_id = resolved[item["ord"]]["trajectory_id"]
                rows.append({**item, "trajectory_id": str(trajectory_id) if trajectory_id else None})
                answer_ids[item["ord"]] = uuid.UUID(item["id"])
            await cursor.execute(_INSERT, {"rows": orjson.dumps(rows).decode()})
            await cursor.execute(_RECOMPUTE_GIVEN, {"trajectories": list(trajectories),
                                                    "tenants": [t for t, _ in new_keys],
                                                    "keys": [k for _, k in new_keys]})
            if trajectories and any(i["group_id"] for i in fresh):
                await cursor.execute(_GROUPS_GIVEN, {"trajectories": list(trajectories)})
        await cursor.execute(_ANSWERS, {"ids": list(set(answer_ids.values()))})
        by_id = {row["id"]: answer(row) for row in await cursor.fetchall()}
        return [by_id[answer_ids[item["ord"]]] for item in items], not fresh

    return await _retrying(engine, work)


LinkCheck = Callable[[str | None, str, float, dict[str, float]], str | None]


async def link_pending_rewards(engine: AsyncEngine, check: LinkCheck, *, window_s: float,
                               include_overdue: bool = False, limit: int = 5000) -> int:
    """Link pending rewards whose trajectory has landed; returns how many were linked.

    `check(policy, name, value, metrics)` returns a reason when the trajectory's policy
    refuses the reward: it is then stored as 'rejected' (reported, never current).
    """

    async def work(cursor: psycopg.AsyncCursor) -> int:
        await cursor.execute(_PENDING_CANDIDATES, {"all": include_overdue, "window_s": window_s, "limit": limit})
        candidates = await cursor.fetchall()
        if not candidates:
            return 0
        await _lock(cursor, {lock_key(b"k", c["tenant"], c["idempotency_key"])
                             for c in candidates if c["idempotency_key"]})
        roots = {c["root"] for c in candidates}
        await _lock(cursor, {lock_key(b"t", root) for root in roots})
        links = []
        for c in candidates:
            reason = check(c["policy"], c["name"], c["value"], c["metrics"] or {})
            links.append({"id": str(c["id"]), "root": str(c["root"]),
                          "status": "rejected" if reason else "linked", "reason": reason})
        await cursor.execute(_LINK, {"links": orjson.dumps(links).decode()})
        linked = cursor.rowcount
        params = {"trajectories": list(roots), "tenants": [], "keys": []}
        await cursor.execute(_RECOMPUTE_GIVEN, params)
        await cursor.execute(_GROUPS_GIVEN, params)
        return linked

    return await _retrying(engine, work)


async def forget_old_signatures(engine: AsyncEngine, older_than_s: float) -> int:
    async with engine.begin() as connection:
        pg = await _driver_connection(connection)
        async with pg.cursor() as cursor:
            await cursor.execute("DELETE FROM reward_signatures WHERE signed_at < now() - make_interval(secs => %s)",
                                 (older_than_s,))
            return cursor.rowcount


_PENDING_LIST = f"""
SELECT {_REWARD_COLUMNS}, r.received_at < now() - make_interval(secs => %(window_s)s) AS overdue
FROM rewards r
WHERE r.status = ANY(%(statuses)s::text[]) AND (%(tenant)s::text IS NULL OR r.tenant = %(tenant)s)
  AND (NOT %(overdue_only)s OR r.status <> 'pending' OR r.received_at < now() - make_interval(secs => %(window_s)s))
ORDER BY r.received_at
LIMIT %(limit)s
"""

_PENDING_COUNTS = """
SELECT count(*) FILTER (WHERE status = 'pending') AS pending,
       count(*) FILTER (WHERE status = 'pending' AND received_at < now() - make_interval(secs => %(window_s)s))
           AS overdue,
       count(*) FILTER (WHERE status = 'rejected') AS rejected
FROM rewards
WHERE (status = 'pending' OR status = 'rejected') AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
"""


async def list_unlinked(engine: AsyncEngine, *, tenant: str | None, window_s: float, statuses: list[str],
                        overdue_only: bool, limit: int) -> dict[str, Any]:
    params = {"tenant": tenant, "window_s": window_s, "statuses": statuses, "overdue_only": overdue_only,
              "limit": limit + 1}
    async with engine.connect() as connection:
        pg = await _driver_connection(connection)
        async with pg.cursor(row_factory=dict_row) as cursor:
            await cursor.execute(_PENDING_LIST, params)
            rows = await cursor.fetchall()
            await cursor.execute(_PENDING_COUNTS, params)
            counts = await cursor.fetchone()
        await pg.commit()
    data = [{**answer(row), "overdue": bool(row["overdue"]) and row["status"] == "pending"} for row in rows[:limit]]
    return {"object": "list", "data": data, "pending_count": counts["pending"], "overdue_count": counts["overdue"],
            "rejected_count": counts["rejected"], "has_more": len(rows) > limit}


async def rewards_of(cursor: psycopg.AsyncCursor, trajectory_ids: list[uuid.UUID], *,
                     history: bool) -> list[dict[str, Any]]:
    condition = "" if history else "AND r.status = 'linked' AND r.superseded_at IS NULL"
    await cursor.execute(f"SELECT {_REWARD_COLUMNS} FROM rewards r WHERE r.trajectory_id = ANY(%(ids)s::uuid[]) "
                         f"{condition} ORDER BY r.name, r.observed_at, r.seq", {"ids": trajectory_ids})
    return [answer(row) for row in await cursor.fetchall()]


async def get_reward(engine: AsyncEngine, reward_id: uuid.UUID, tenant: str | None) -> dict[str, Any] | None:
    async with engine.connect() as connection:
        pg = await _driver_connection(connection)
        async with pg.cursor(row_factory=dict_row) as cursor:
            await cursor.execute(f"SELECT {_REWARD_COLUMNS} FROM rewards r WHERE r.id = %(id)s "
                                 "AND (%(tenant)s::text IS NULL OR r.tenant = %(tenant)s)",
                                 {"id": reward_id, "tenant": tenant})
            row = await cursor.fetchone()
        await pg.commit()
    return answer(row) if row else None
