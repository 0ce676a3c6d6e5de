"""Links rewards that arrived before their trajectory, in the background of each process.

The shipper only sets an event after storing a batch of calls (no query on its path); this
task then waits a moment to gather more batches and runs one linking pass, which starts
with a probe of the partial index of pending rewards and ends at once when there are none.
It also runs every few seconds (a reward posted to another process, or committed just after
a pass), tries overdue rewards once a minute, and forgets old webhook signatures.
"""

from __future__ import annotations

import asyncio
import logging
import time

from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.settings import Settings
from gateway.rewards.rules import RewardRules
from gateway.store.rewards import forget_old_signatures, link_pending_rewards

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
        self._wanted = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._last_overdue = 0.0
        self.linked = 0

    def wake(self) -> None:
        self._wanted.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="reward-linker")

    async def stop(self) -> None:
        # A flag, not cancel(): Python 3.11's wait_for can swallow a cancellation that lands as
        # the event fires (gh-86296), which left shutdown waiting on this task forever.
        self._stopping = True
        self._wanted.set()
        if self._task:
            try:
                await asyncio.wait_for(self._task, timeout=STOP_TIMEOUT_S)
            except (asyncio.TimeoutError, asyncio.CancelledError, Exception):
                pass

    def _check(self, policy: str | None, name: str, value: float, metrics: dict[str, float]) -> str | None:
        problem = self.rules.check(policy, name, value, metrics)
        return f"{problem.field}: {problem.message}" if problem else None

    async def run_once(self) -> int:
        now = time.monotonic()
        overdue = now - self._last_overdue > OVERDUE_PERIOD_S
        linked = await link_pending_rewards(self.engine, self._check, window_s=self.settings.pending_window_s,
                                            include_overdue=overdue, limit=LINK_PAGE)
        if overdue:
            self._last_overdue = now
            await forget_old_signatures(self.engine, 2 * self.settings.tolerance_s)
        self.linked += linked
        return linked

    async def _loop(self) -> None:
        while not self._stopping:
            try:
                await asyncio.wait_for(self._wanted.wait(), timeout=PERIOD_S)
                if self._stopping:
                    return
                await asyncio.sleep(GATHER_S)
            except asyncio.TimeoutError:
                pass
            self._wanted.clear()
            try:
                if await self.run_once() >= LINK_PAGE:
                    self._wanted.set()  # a full page: more may be waiting
            except Exception as exc:
                log.warning("linking pending rewards failed (%s); will retry", exc)
