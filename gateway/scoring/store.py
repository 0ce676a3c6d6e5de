"""The reward functions' claims, budget and scores in PostgreSQL (table function_scorings).

Which trajectories a function scores: the policy's trainable, untrained, unmerged ones (the
judge's own calls never) whose last call is at least `wait_s` old and at most the learner's
`max_age_s`, that have no current reward named as the function's, and that it has not scored,
is not scoring now (a lease) and has not failed `max_attempts` times. A claim runs under a
transaction-level advisory lock per policy and function, so gateway processes claiming at once
neither score one trajectory twice nor together exceed `max_calls_per_hour`.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.grouping import JUDGE_TRAJECTORY_PREFIX
from apprentice.settings import PolicySettings, RewardFunctionSettings
from gateway.judging.store import _Cursor
from gateway.store.rewards import NewReward, ingest_rewards

SOURCE = "function"
_LOCK_CLASS = 0x4150_5246  # "APRF"

_CLAIM = """
WITH used AS (
    SELECT count(*) AS n FROM function_scorings
    WHERE policy = %(policy)s AND name = %(name)s AND started_at > now() - interval '1 hour'
), ready AS (
    SELECT t.id, t.tenant FROM trajectories t
    WHERE t.policy = %(policy)s AND t.merged_into IS NULL AND t.trainable AND t.trained_in_run_id IS NULL
      AND (t.client_trajectory_id IS NULL OR NOT starts_with(t.client_trajectory_id, %(judge_prefix)s))
      AND t.last_call_at <= now() - make_interval(secs => %(wait_s)s)
      AND t.last_call_at >= now() - make_interval(secs => %(max_age_s)s)
      AND NOT EXISTS (SELECT 1 FROM rewards r WHERE r.trajectory_id = t.id AND r.name = %(name)s
                      AND r.status = 'linked' AND r.superseded_at IS NULL)
      AND NOT EXISTS (SELECT 1 FROM function_scorings f WHERE f.trajectory_id = t.id AND f.name = %(name)s
                      AND (f.status = 'scored' OR f.attempts >= %(max_attempts)s
                           OR (f.status = 'running' AND f.lease_until > now())))
    ORDER BY t.last_call_at
    LIMIT greatest(least(%(limit)s, %(per_hour)s - (SELECT n FROM used)), 0)
)
INSERT INTO function_scorings AS f (trajectory_id, name, policy, status, attempts, lease_until, started_at)
SELECT id, %(name)s, %(policy)s, 'running', 1, now() + make_interval(secs => %(lease_s)s), now() FROM ready
ON CONFLICT (trajectory_id, name) DO UPDATE SET
    status = 'running', attempts = f.attempts + 1, lease_until = excluded.lease_until,
    started_at = excluded.started_at, error = NULL
RETURNING f.trajectory_id::text AS trajectory_id, f.attempts,
          (SELECT tenant FROM ready WHERE ready.id = f.trajectory_id) AS tenant
"""

_CALLS = """
SELECT c.request, c.response FROM calls c
WHERE c.trajectory_id = %(id)s AND c.status_code = 200 AND c.response IS NOT NULL
  AND c.created_at >= (SELECT t.first_call_at - interval '1 day' FROM trajectories t WHERE t.id = %(id)s)
ORDER BY c.created_at, c.id
"""


@dataclass(frozen=True, slots=True)
class Claimed:
    """A trajectory a function scores now."""

    trajectory_id: str
    tenant: str
    attempt: int


def _lock_key(policy: str, name: str) -> int:
    digest = hashlib.blake2b(f"{policy}\x00{name}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big", signed=True)


async def claim(
    engine: AsyncEngine, policy: PolicySettings, function: RewardFunctionSettings, limit: int
) -> list[Claimed]:
    """Up to `limit` trajectories for `function` to score, within its hourly budget."""
    async with _Cursor(engine) as cursor:
        await cursor.execute(
            "SELECT pg_advisory_xact_lock(%s, %s)", (_LOCK_CLASS, _lock_key(policy.name, function.name))
        )
        await cursor.execute(
            _CLAIM,
            {
                "policy": policy.name,
                "name": function.name,
                "judge_prefix": JUDGE_TRAJECTORY_PREFIX,
                "wait_s": function.wait_s,
                "max_age_s": policy.learning.max_age_s,
                "max_attempts": function.max_attempts,
                "limit": limit,
                "per_hour": function.max_calls_per_hour,
                "lease_s": function.timeout_s * 2,
            },
        )
        return [Claimed(r["trajectory_id"], r["tenant"], r["attempts"]) for r in await cursor.fetchall()]


async def budget_used(engine: AsyncEngine, policy: str, name: str) -> int:
    """Scorings started in the last hour (the budget's use)."""
    async with _Cursor(engine) as cursor:
        await cursor.execute(
            "SELECT count(*) AS n FROM function_scorings WHERE policy = %s AND name = %s "
            "AND started_at > now() - interval '1 hour'",
            (policy, name),
        )
        row = await cursor.fetchone()
        return int(row["n"]) if row else 0


async def conversation(engine: AsyncEngine, trajectory_id: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The trajectory's answered calls as (request, response), in order."""
    async with _Cursor(engine) as cursor:
        await cursor.execute(_CALLS, {"id": trajectory_id})
        return [(row["request"], row["response"]) for row in await cursor.fetchall()]


async def record_score(
    engine: AsyncEngine, policy: str, function: RewardFunctionSettings, claimed: Claimed, value: float
) -> None:
    """The score as a reward (source 'function', idempotent per trajectory and name), then the claim scored."""
    reward = NewReward(
        id=uuid.uuid4(),
        tenant=claimed.tenant,
        target_kind="trajectory",
        target=claimed.trajectory_id,
        target_trajectory_id=uuid.UUID(claimed.trajectory_id),
        target_call=None,
        name=function.name,
        value=value,
        metrics={},
        comment=None,
        group_id=None,
        idempotency_key=f"{SOURCE}:{function.name}:{claimed.trajectory_id}",
        source=SOURCE,
        api_key_id=None,
        observed_at=time.time(),
    )
    await ingest_rewards(engine, [reward], check=lambda _targets: None)
    await _finish(engine, claimed, function.name, "scored", value=value, error=None)


async def record_failure(engine: AsyncEngine, function: RewardFunctionSettings, claimed: Claimed, error: str) -> None:
    """This attempt failed; the trajectory is tried again until max_attempts."""
    await _finish(engine, claimed, function.name, "failed", value=None, error=error[:2000])


async def _finish(
    engine: AsyncEngine, claimed: Claimed, name: str, status: str, *, value: float | None, error: str | None
) -> None:
    async with _Cursor(engine) as cursor:
        await cursor.execute(
            "UPDATE function_scorings SET status = %s, value = %s, error = %s, finished_at = now(), "
            "lease_until = NULL WHERE trajectory_id = %s AND name = %s",
            (status, value, error, claimed.trajectory_id, name),
        )
