"""Links rewards that arrived before their trajectory, in the background of each process.

The shipper only sets an event after storing a batch of calls (no query on its path); this
task then waits a moment to gather more batches and runs one linking pass, which starts
with a probe of the partial index of pending rewards and ends at once when there are none.
It also runs every few seconds (a reward posted to another process, or committed just after
a pass), tries overdue rewards once a minute, forgets old webhook signatures, and deletes
pending rewards past `rewards.pending_expiry_s` (their answer named that time). The loop is a
`PeriodicWorker` (gateway/workers.py), which also owns the stop-without-hanging logic.
"""

from __future__ import annotations

import logging
import time

from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.settings import Settings
from gateway.rewards.rules import RewardRules
from gateway.store.rewards import expire_pending_rewards, forget_old_signatures, link_pending_rewards
from gateway.workers import PeriodicWorker

log = logging.getLogger(__name__)

GATHER_S = 0.1
PERIOD_S = 2.0
OVERDUE_PERIOD_S = 60.0
LINK_PAGE = 5000
STOP_TIMEOUT_S = 10.0


class RewardLinker:
    def __init__(self, engine: AsyncEngine, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings.rewards
        self.rules = RewardRules(settings)
        self._last_overdue = 0.0
        self._last_expiry = 0.0
        self.linked = 0
        self.worker = PeriodicWorker(
            "reward-linker", self._link_pass, interval_s=PERIOD_S, wake_delay_s=GATHER_S, stop_timeout_s=STOP_TIMEOUT_S
        )

    def wake(self) -> None:
        self.worker.wake()

    def start(self) -> None:
        self.worker.start()

    async def stop(self) -> None:
        await self.worker.stop()

    def _check(self, policy: str | None, name: str, value: float, metrics: dict[str, float]) -> str | None:
        problem = self.rules.check(policy, name, value, metrics)
        return f"{problem.field}: {problem.message}" if problem else None

    async def run_once(self) -> int:
        now = time.monotonic()
        overdue = now - self._last_overdue > OVERDUE_PERIOD_S
        linked = await link_pending_rewards(
            self.engine, self._check, window_s=self.settings.pending_window_s, include_overdue=overdue, limit=LINK_PAGE
        )
        if overdue:
            self._last_overdue = now
            await forget_old_signatures(self.engine, 2 * self.settings.tolerance_s)
        # Expiry is checked a few times per expiry period (at most once a minute): a reward outlives
        # its `expires_at` by at most a quarter of the period.
        if now - self._last_expiry > min(OVERDUE_PERIOD_S, self.settings.pending_expiry_s / 4):
            self._last_expiry = now
            expired = await expire_pending_rewards(self.engine, self.settings.pending_expiry_s)
            if expired:
                log.info(
                    "deleted %d pending rewards whose trajectories did not land within %.0f s",
                    expired,
                    self.settings.pending_expiry_s,
                )
        self.linked += linked
        return linked

    async def _link_pass(self) -> None:
        if await self.run_once() >= LINK_PAGE:
            self.worker.wake()  # a full page: more may be waiting
