"""Reading trajectories for the API: one with its calls and rewards, or a filtered page."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.store.rewards import _driver_connection, rewards_of

_SUMMARY_COLUMNS = """t.id, t.tenant, t.model, t.policy, t.client_trajectory_id, t.group_id, t.adapter_version_id,
    t.first_call_at, t.last_call_at, t.call_count, t.trained_in_run_id,
    (SELECT r.value FROM rewards r WHERE r.trajectory_id = t.id AND r.name = 'reward' AND r.status = 'linked'
       AND r.superseded_at IS NULL ORDER BY r.observed_at DESC LIMIT 1) AS reward,
    (SELECT count(*) FROM rewards r WHERE r.trajectory_id = t.id AND r.status = 'linked'
       AND r.superseded_at IS NULL) AS reward_count"""

_CALL_COLUMNS = """id, response_id, created_at, model, upstream, upstream_model, adapter_version_id, status_code,
    stream, latency_ms, ttft_ms, prompt_tokens, completion_tokens, temperature, request, response, error"""


def _text(value: Any) -> Any:
    return str(value) if isinstance(value, uuid.UUID) else value


def _summary(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: _text(v) for k, v in row.items()}
    out["object"] = "trajectory"
    return out


async def get_trajectory(engine: AsyncEngine, candidates: list[uuid.UUID], tenant: str | None, *,
                         history: bool) -> dict[str, Any] | None:
    """The first of `candidates` that exists (an alias resolves to its root), with its details."""
    async with engine.connect() as connection:
        pg = await _driver_connection(connection)
        async with pg.cursor(row_factory=dict_row) as cursor:
            await cursor.execute("SET LOCAL jit = off")
            await cursor.execute(
                "SELECT coalesce(t.merged_into, t.id) AS root FROM trajectories t "
                "WHERE t.id = ANY(%(ids)s::uuid[]) AND (%(tenant)s::text IS NULL OR t.tenant = %(tenant)s) "
                "ORDER BY array_position(%(ids)s::uuid[], t.id) LIMIT 1", {"ids": candidates, "tenant": tenant})
            found = await cursor.fetchone()
            if found is None:
                await pg.rollback()
                return None
            root = found["root"]
            await cursor.execute(f"SELECT {_SUMMARY_COLUMNS} FROM trajectories t WHERE t.id = %s", (root,))
            out = _summary(await cursor.fetchone())
            await cursor.execute("SELECT id FROM trajectories WHERE merged_into = %s ORDER BY id", (root,))
            out["aliases"] = [str(r["id"]) for r in await cursor.fetchall()]
            group_ids: list[str] = []
            if out["group_id"]:
                await cursor.execute(
                    "SELECT id FROM trajectories WHERE group_id = %s AND tenant = %s AND id <> %s "
                    "AND merged_into IS NULL ORDER BY first_call_at LIMIT 100",
                    (out["group_id"], out["tenant"], root))
                group_ids = [str(r["id"]) for r in await cursor.fetchall()]
            out["group_trajectory_ids"] = group_ids
            await cursor.execute(f"SELECT {_CALL_COLUMNS} FROM calls WHERE trajectory_id = %s ORDER BY created_at, id",
                                 (root,))
            out["calls"] = [{k: _text(v) for k, v in r.items()} for r in await cursor.fetchall()]
            out["adapter_version_ids"] = sorted({c["adapter_version_id"] for c in out["calls"]
                                                 if c["adapter_version_id"]})
            out["rewards"] = await rewards_of(cursor, [root], history=history)
        await pg.rollback()
    return out


async def list_trajectories(engine: AsyncEngine, *, tenant: str | None, policy: str | None, model: str | None,
                            since: datetime | None, until: datetime | None, rewarded: bool | None,
                            reward_name: str, group_id: str | None, starting_after: uuid.UUID | None,
                            limit: int) -> dict[str, Any]:
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
        conditions.append(("" if rewarded else "NOT ") + "EXISTS (SELECT 1 FROM rewards r WHERE r.trajectory_id = t.id "
                          "AND r.name = %(reward_name)s AND r.status = 'linked' AND r.superseded_at IS NULL)")
    if starting_after is not None:
        conditions.append("(t.last_call_at, t.id) < (SELECT a.last_call_at, a.id FROM trajectories a "
                          "WHERE a.id = %(after)s)")
        params["after"] = starting_after
    query = (f"SELECT {_SUMMARY_COLUMNS} FROM trajectories t WHERE {' AND '.join(conditions)} "
             "ORDER BY t.last_call_at DESC, t.id DESC LIMIT %(limit)s")
    async with engine.connect() as connection:
        pg = await _driver_connection(connection)
        async with pg.cursor(row_factory=dict_row) as cursor:
            await cursor.execute("SET LOCAL jit = off")
            await cursor.execute(query, params)
            rows = await cursor.fetchall()
        await pg.rollback()
    data = [_summary(row) for row in rows[:limit]]
    more = len(rows) > limit
    return {"object": "list", "data": data, "has_more": more,
            "next_starting_after": data[-1]["id"] if more and data else None}
