"""The two clocks the promotion code reads: this process's and the database server's.

Times compared with what the database wrote (transitions, a canary's start, the unload grace,
retention) are read from the database (`database_now`); the tick passes that time on. Where no
time is passed, `process_now` stamps what this process writes (when gates were checked) and
dates a canary's evaluation computed for the version page.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["database_now", "process_now"]


def process_now() -> datetime:
    return datetime.now(timezone.utc)


async def database_now(engine: AsyncEngine) -> datetime:
    """The database server's clock (`clock_timestamp()`, not the transaction's start).

    Why: every time the promotion job compares with -- a transition's `created_at`, a canary's
    start, the unload grace, retention -- was written by the database's `now()`. Comparing them
    with this process's clock mixes two clocks: a learner host whose clock lags the database's
    by more than the grace never unloads a version that stopped serving (and one that runs ahead
    unloads it early). One clock, the database's, makes the grace mean what it says."""
    async with engine.connect() as connection:
        now: datetime = (await connection.execute(text("SELECT clock_timestamp()"))).scalar_one()
    return now
