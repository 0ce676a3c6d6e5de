"""Reading what judge agreement is computed from: trajectories with both a current webhook reward
and a current judge score, each with the judgement (the group) its score came from.

A judge score is a reward with `source = 'judge'`, the judge's reward name and a `judgement_id`;
the judgement belongs to the policy. The webhook reward is the current reward of the same
trajectory under the policy's learning reward name, from any source but the judge (so a
judge score can never be compared with itself). "Current" is the rewards table's invariant
(status 'linked', superseded_at NULL: at most one per trajectory and name), so each trajectory
gives at most one row. Rewards are linked to the root of a merged trajectory, so both sides
name the same id.

The judged-at time is the judgement's `finished_at`; a judgement still marked 'running' whose
scores are already stored (the judge writes the scores first, then marks it 'judged') counts
from when its score was observed.
"""

from __future__ import annotations

import asyncio
from datetime import datetime

from psycopg.rows import dict_row
from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.settings import JudgeSettings, PolicySettings
from gateway.judging.agreement import AgreementReport, Bucket, ScoredTrajectory, agreement
from gateway.store.connection import driver_connection

# ix_judgements_policy_started finds the policy's judgements, ix_rewards_judgement their
# scores, ix_rewards_current each trajectory's webhook reward.
_SCORED = """
SELECT j.id AS judgement_id, s.trajectory_id, w.value AS webhook, s.value AS judge,
       coalesce(j.finished_at, s.observed_at) AS judged_at, j.judge_model, j.rubric_hash
FROM judgements j
JOIN rewards s ON s.judgement_id = j.id AND s.source = 'judge' AND s.name = %(judge_name)s
              AND s.status = 'linked' AND s.superseded_at IS NULL
JOIN rewards w ON w.trajectory_id = s.trajectory_id AND w.name = %(webhook_name)s AND w.source <> 'judge'
              AND w.status = 'linked' AND w.superseded_at IS NULL
WHERE j.policy = %(policy)s
  AND (%(rubric_hash)s::text IS NULL OR j.rubric_hash = %(rubric_hash)s::text)
  AND (%(since)s::timestamptz IS NULL OR coalesce(j.finished_at, s.observed_at) >= %(since)s::timestamptz)
"""


async def scored_trajectories(
    engine: AsyncEngine,
    policy: str,
    *,
    webhook_name: str,
    judge_name: str,
    since: datetime | None = None,
    rubric_hash: str | None = None,
) -> list[ScoredTrajectory]:
    """The policy's trajectories with both rewards, judged at or after `since` (all when None),
    by judgements of `rubric_hash` (any when None)."""
    params = {
        "policy": policy,
        "webhook_name": webhook_name,
        "judge_name": judge_name,
        "since": since,
        "rubric_hash": rubric_hash,
    }
    async with engine.connect() as connection:
        pg = await driver_connection(connection)
        async with pg.cursor(row_factory=dict_row) as cursor:
            await cursor.execute("SET LOCAL jit = off")  # a plain index walk: compiling costs more than it saves
            await cursor.execute(_SCORED, params)
            rows = await cursor.fetchall()
        await pg.rollback()
    return [ScoredTrajectory(**row) for row in rows]


def judge_reward_name(policy: PolicySettings) -> str:
    """The judge's reward name for `policy`: `judge.reward_name`, else the default (`judge`)."""
    return policy.judge.reward_name if policy.judge else JudgeSettings.model_fields["reward_name"].default


async def policy_agreement(
    engine: AsyncEngine,
    policy: PolicySettings,
    *,
    bucket: Bucket,
    since: datetime | None = None,
    rubric_hash: str | None = None,
) -> AgreementReport:
    """The policy's judge agreement report, as the admin API and the dashboard show it. The
    bootstrap is CPU work (up to about half a second): it runs off the event loop."""
    rows = await scored_trajectories(
        engine,
        policy.name,
        webhook_name=policy.learning.reward_name,
        judge_name=judge_reward_name(policy),
        since=since,
        rubric_hash=rubric_hash,
    )
    return await asyncio.to_thread(agreement, rows, bucket=bucket)
