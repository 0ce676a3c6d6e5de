"""Reading trajectories for the API: one with its calls and rewards, or a filtered page.

Readers get dataclasses whose fields are exactly the columns selected, so that a column added or
renamed in a query fails loudly instead of silently changing an answer.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from psycopg import AsyncCursor
from psycopg.rows import dict_row
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.store.connection import driver_connection
from gateway.store.rewards import StoredReward, rewards_of

# calls is partitioned by created_at (docs/history.md): a trajectory's calls are read between its
# first and last call, widened by this for rows written by other tools.
CALL_BOUND_SLACK = timedelta(days=1)

_SUMMARY_COLUMNS = """t.id, t.tenant, t.model, t.policy, t.client_trajectory_id, t.group_id, t.adapter_version_id,
    t.first_call_at, t.last_call_at, t.call_count, t.trained_in_run_id, t.trainable,
    (SELECT r.value FROM rewards r WHERE r.trajectory_id = t.id AND r.name = 'reward' AND r.status = 'linked'
       AND r.superseded_at IS NULL ORDER BY r.observed_at DESC LIMIT 1) AS reward,
    (SELECT count(*) FROM rewards r WHERE r.trajectory_id = t.id AND r.status = 'linked'
       AND r.superseded_at IS NULL) AS reward_count"""

_CALL_COLUMNS = """id, response_id, created_at, model, upstream, upstream_model, adapter_version_id, status_code,
    stream, latency_ms, ttft_ms, prompt_tokens, completion_tokens, temperature, request, response, error"""

# The first candidate that names a trajectory of the tenant; an alias resolves to its root.
_FIND_ROOT = """
SELECT coalesce(t.merged_into, t.id) AS root FROM trajectories t
WHERE t.id = ANY(%(ids)s::uuid[]) AND (%(tenant)s::text IS NULL OR t.tenant = %(tenant)s)
ORDER BY array_position(%(ids)s::uuid[], t.id) LIMIT 1
"""

_GROUP_MEMBERS = """
SELECT id FROM trajectories
WHERE group_id = %s AND tenant = %s AND id <> %s AND merged_into IS NULL
ORDER BY first_call_at LIMIT 100
"""


@dataclass(frozen=True, slots=True)
class TrajectoryRow:
    """A trajectory's summary: the columns of `_SUMMARY_COLUMNS`."""

    id: uuid.UUID
    tenant: str
    model: str
    policy: str | None
    client_trajectory_id: str | None
    group_id: str | None
    adapter_version_id: uuid.UUID | None  # the version that served the first call
    first_call_at: datetime
    last_call_at: datetime
    call_count: int
    trained_in_run_id: uuid.UUID | None
    trainable: bool  # false: a key's or the policy's opt-out (recorded, never trained on)
    reward: float | None  # the current reward named "reward"
    reward_count: int  # current rewards, one per name


@dataclass(frozen=True, slots=True)
class CallRow:
    """A stored call: the columns of `_CALL_COLUMNS`."""

    id: uuid.UUID
    response_id: str | None
    created_at: datetime
    model: str
    upstream: str | None
    upstream_model: str | None
    adapter_version_id: uuid.UUID | None
    status_code: int
    stream: bool
    latency_ms: float | None
    ttft_ms: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    temperature: float | None
    request: dict[str, Any]
    response: dict[str, Any] | None
    error: Any | None


@dataclass(frozen=True, slots=True)
class TrajectoryDetails:
    trajectory: TrajectoryRow
    aliases: list[uuid.UUID]  # trajectories merged into this one
    group_members: list[uuid.UUID]  # other trajectories of its group, at most 100
    calls: list[CallRow]
    rewards: list[StoredReward]

    @property
    def adapter_version_ids(self) -> list[uuid.UUID]:
        """Every adapter version that served one of its calls."""
        return sorted({call.adapter_version_id for call in self.calls if call.adapter_version_id})


@dataclass(frozen=True, slots=True)
class TrajectoryPage:
    trajectories: list[TrajectoryRow]
    has_more: bool


async def get_trajectory(
    engine: AsyncEngine, candidates: list[uuid.UUID], tenant: str | None, *, history: bool
) -> TrajectoryDetails | None:
    """The first of `candidates` that exists (an alias resolves to its root), with its details."""
    async with engine.connect() as connection:
        pg = await driver_connection(connection)
        async with pg.cursor(row_factory=dict_row) as cursor:
            await cursor.execute("SET LOCAL jit = off")
            await cursor.execute(_FIND_ROOT, {"ids": candidates, "tenant": tenant})
            found = await cursor.fetchone()
            details = await _details(cursor, found["root"], history=history) if found else None
        await pg.rollback()
    return details


async def _details(cursor: AsyncCursor[dict[str, Any]], root: uuid.UUID, *, history: bool) -> TrajectoryDetails:
    await cursor.execute(f"SELECT {_SUMMARY_COLUMNS} FROM trajectories t WHERE t.id = %s", (root,))
    row = await cursor.fetchone()
    assert row is not None  # the root was just found in the same transaction
    trajectory = TrajectoryRow(**row)
    await cursor.execute("SELECT id FROM trajectories WHERE merged_into = %s ORDER BY id", (root,))
    aliases = [alias["id"] for alias in await cursor.fetchall()]
    group_members: list[uuid.UUID] = []
    if trajectory.group_id:
        await cursor.execute(_GROUP_MEMBERS, (trajectory.group_id, trajectory.tenant, root))
        group_members = [member["id"] for member in await cursor.fetchall()]
    # Bounded by the trajectory's first and last call (a day of slack for rows written by other
    # tools): calls is partitioned by created_at, so only the partitions of those days are read.
    await cursor.execute(
        f"SELECT {_CALL_COLUMNS} FROM calls WHERE trajectory_id = %s AND created_at BETWEEN %s AND %s "
        "ORDER BY created_at, id",
        (root, trajectory.first_call_at - CALL_BOUND_SLACK, trajectory.last_call_at + CALL_BOUND_SLACK),
    )
    calls = [CallRow(**call) for call in await cursor.fetchall()]
    rewards = await rewards_of(cursor, [root], history=history)
    return TrajectoryDetails(
        trajectory=trajectory, aliases=aliases, group_members=group_members, calls=calls, rewards=rewards
    )


async def list_trajectories(
    engine: AsyncEngine,
    *,
    tenant: str | None,
    policy: str | None,
    model: str | None,
    since: datetime | None,
    until: datetime | None,
    rewarded: bool | None,
    reward_name: str,
    group_id: str | None,
    starting_after: uuid.UUID | None,
    limit: int,
) -> TrajectoryPage:
    """Newest first (by last call), merged aliases left out; keyset-paged by `starting_after`."""
    conditions = ["t.merged_into IS NULL"]
    params: dict[str, Any] = {"limit": limit + 1, "reward_name": reward_name}
    for column, value in (("tenant", tenant), ("policy", policy), ("model", model), ("group_id", group_id)):
        if value is not None:
            conditions.append(f"t.{column} = %({column})s")
            params[column] = value
    if since is not None:
        conditions.append("t.last_call_at >= %(since)s")
        params["since"] = since
    if until is not None:
        conditions.append("t.last_call_at < %(until)s")
        params["until"] = until
    if rewarded is not None:
        conditions.append(
            ("" if rewarded else "NOT ") + "EXISTS (SELECT 1 FROM rewards r WHERE r.trajectory_id = t.id "
            "AND r.name = %(reward_name)s AND r.status = 'linked' AND r.superseded_at IS NULL)"
        )
    if starting_after is not None:
        conditions.append(
            "(t.last_call_at, t.id) < (SELECT a.last_call_at, a.id FROM trajectories a WHERE a.id = %(after)s)"
        )
        params["after"] = starting_after
    query = (
        f"SELECT {_SUMMARY_COLUMNS} FROM trajectories t WHERE {' AND '.join(conditions)} "
        "ORDER BY t.last_call_at DESC, t.id DESC LIMIT %(limit)s"
    )
    async with engine.connect() as connection:
        pg = await driver_connection(connection)
        async with pg.cursor(row_factory=dict_row) as cursor:
            await cursor.execute("SET LOCAL jit = off")
            await cursor.execute(query, params)
            rows = await cursor.fetchall()
        await pg.rollback()
    return TrajectoryPage(trajectories=[TrajectoryRow(**row) for row in rows[:limit]], has_more=len(rows) > limit)
