"""What exploration spent, read from the calls every gateway process recorded (the admin API).

An unserved attempt is a calls row with `explores_call_id` set (migration 0015); its
completion tokens are the extra tokens generated. The (policy, created_at) index bounds it.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

_SPEND = text(
    """
SELECT count(*) AS answers, count(DISTINCT explores_call_id) AS explored_calls,
       coalesce(sum(completion_tokens), 0) AS tokens
FROM calls
WHERE policy = :policy AND created_at >= now() - make_interval(secs => :window_s)
  AND explores_call_id IS NOT NULL
"""
)


@dataclass(frozen=True)
class ExplorationSpend:
    window_s: float
    answers: int  # unserved answers recorded
    explored_calls: int  # served calls they explored
    tokens: int  # tokens generated for them


async def exploration_spend(engine: AsyncEngine, policy: str, window_s: float) -> ExplorationSpend:
    """Recorded exploration of a policy within the last `window_s` seconds, all processes."""
    async with engine.connect() as connection:
        row = (await connection.execute(_SPEND, {"policy": policy, "window_s": window_s})).one()
    return ExplorationSpend(window_s, int(row.answers), int(row.explored_calls), int(row.tokens))
