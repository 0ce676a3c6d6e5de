"""Exchanging the processes' counts through PostgreSQL, off the request path.

Every `limits.sync_interval_s` each gateway process, in one transaction: upserts its live
window counts (absolute values, keyed by its process id, so a retried step changes nothing),
reads the sum of every other process's rows for the live windows, and deletes rows of windows
that have passed. The limiter then decides from its own counts plus that sum. What another
process admitted reaches this one's view within two intervals (its write, then this read),
which bounds how far the processes together can go over a limit (docs/limits.md).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid

from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.limits.limiter import MINUTE_S, Limiter
from gateway.store.connection import driver_connection
from gateway.workers import PeriodicWorker

log = logging.getLogger(__name__)

STOP_SYNC_TIMEOUT_S = 2.0

_UPSERT = """
INSERT INTO limit_counters AS c (process_id, scope, window_s, window_index, requests, tokens, spend_usd, updated_at)
SELECT %(process)s, u.scope, u.window_s, u.window_index, u.requests, u.tokens, u.spend_usd, now()
FROM unnest(%(scopes)s::text[], %(windows)s::int[], %(indexes)s::bigint[], %(requests)s::bigint[],
            %(tokens)s::bigint[], %(spends)s::float8[])
     AS u(scope, window_s, window_index, requests, tokens, spend_usd)
ON CONFLICT (process_id, scope, window_s, window_index) DO UPDATE SET
    requests = excluded.requests, tokens = excluded.tokens, spend_usd = excluded.spend_usd, updated_at = now()
"""

_OTHERS = """
SELECT scope, window_s, window_index, sum(requests)::bigint, sum(tokens)::bigint, sum(spend_usd)
FROM limit_counters
WHERE process_id <> %(process)s
  AND ((window_s = %(minute_s)s AND window_index >= %(minute)s - 1)
       OR (window_s = %(budget_s)s AND window_index >= %(budget)s))
GROUP BY scope, window_s, window_index
"""

_PRUNE = """
DELETE FROM limit_counters
WHERE (window_s = %(minute_s)s AND window_index < %(minute)s - 1)
   OR (window_s <> %(minute_s)s AND (window_index + 1) * window_s < %(now)s)
"""


def process_id() -> str:
    """Unique per process start: a restarted process's old rows count as another's until they expire."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class LimitSync:
    def __init__(self, engine: AsyncEngine, limiter: Limiter, *, interval_s: float) -> None:
        self.engine = engine
        self.limiter = limiter
        self.process_id = process_id()
        self.worker = PeriodicWorker("limit-sync", self.step, interval_s=interval_s)
        self._loaded = False

    async def start(self) -> None:
        """Load the price map, read the others' counts once (a restarted process must not forget
        the day's spend), then exchange in the background."""
        try:
            await asyncio.to_thread(self.limiter.prices.load)
        except (OSError, ValueError) as exc:  # budgets then count model_info prices only
            log.warning("litellm's cost map could not be read (%s): only model_info prices count", exc)
        await self.worker.run_once()
        self.worker.start()

    async def stop(self) -> None:
        await self.worker.stop()
        # The last counts, for the processes that go on; bounded, so that a store that is down
        # does not hold up shutdown (the journal's shipping comes after this).
        try:
            await asyncio.wait_for(self.worker.run_once(), timeout=STOP_SYNC_TIMEOUT_S)
        except asyncio.TimeoutError:  # TimeoutError itself only from Python 3.11
            pass

    async def step(self) -> None:
        if not self.limiter.active and self._loaded:
            return
        rows = self.limiter.snapshot()
        minute, budget = self.limiter.current_indexes()
        window = {
            "process": self.process_id,
            "minute_s": MINUTE_S,
            "minute": minute,
            "budget_s": int(self.limiter.settings.budget_window_s),
            "budget": budget,
            "now": minute * MINUTE_S,
        }
        async with self.engine.connect() as connection:
            pg = await driver_connection(connection)
            async with pg.transaction():
                async with pg.cursor() as cursor:
                    if rows:
                        columns = list(zip(*rows, strict=True))
                        await cursor.execute(
                            _UPSERT,
                            {
                                "process": self.process_id,
                                "scopes": list(columns[0]),
                                "windows": list(columns[1]),
                                "indexes": list(columns[2]),
                                "requests": list(columns[3]),
                                "tokens": list(columns[4]),
                                "spends": list(columns[5]),
                            },
                        )
                    await cursor.execute(_OTHERS, window)
                    others = await cursor.fetchall()
                    await cursor.execute(_PRUNE, window)
        self.limiter.set_peers(others)
        self._loaded = True
