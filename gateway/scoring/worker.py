"""The reward functions' background worker: every poll, each function claims and scores.

Runs in every gateway process, beside the judge worker and for the same reasons: the gateway
holds the recorded conversations, the reward intake (idempotency, supersession, linking) and
the webhook signing, and it runs while traffic flows, so unserved attempts and unrewarded
answers are scored minutes before a learner run reads them; the learner (which may be a
Kubernetes Job that exists only while it trains) never waits on an operator's endpoint.
The store's claims keep processes from scoring one trajectory twice or together exceeding a
function's hourly budget.
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.settings import PolicySettings, RewardFunctionSettings, Settings
from gateway.scoring import store
from gateway.scoring.scorers import HttpScorer, PythonScorer, ScoringError, payload, scorer_for
from gateway.workers import PeriodicWorker

log = logging.getLogger(__name__)


def scored_functions(settings: Settings) -> list[tuple[PolicySettings, RewardFunctionSettings]]:
    return [(policy, function) for policy in settings.policies for function in policy.reward_functions]


class RewardFunctionWorker:
    def __init__(self, engine: AsyncEngine, settings: Settings) -> None:
        self.engine = engine
        self.functions = scored_functions(settings)
        interval = min((function.poll_interval_s for _, function in self.functions), default=60.0)
        self.worker = PeriodicWorker("reward-functions", self.step, interval_s=interval, first_step_at_once=True)
        self._scorers: dict[tuple[str, str], HttpScorer | PythonScorer] = {}
        self.scored = 0
        self.failed = 0

    @property
    def enabled(self) -> bool:
        return bool(self.functions)

    def start(self) -> None:
        if self.enabled:
            self._scorers = {(p.name, f.name): scorer_for(f) for p, f in self.functions}
            self.worker.start()

    async def stop(self) -> None:
        if self.enabled:
            await self.worker.stop()
            for scorer in self._scorers.values():
                await scorer.close()

    async def step(self) -> None:
        results = await asyncio.gather(*(self._run(p, f) for p, f in self.functions), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            raise failures[0]

    async def _run(self, policy: PolicySettings, function: RewardFunctionSettings) -> None:
        claimed = await store.claim(self.engine, policy, function, function.concurrency)
        if not claimed:
            return
        scorer = self._scorers.get((policy.name, function.name)) or scorer_for(function)
        await asyncio.gather(*(self._score(policy, function, scorer, item) for item in claimed))
        self.worker.wake()  # more may be ready: the next batch at once rather than after a poll

    async def _score(
        self,
        policy: PolicySettings,
        function: RewardFunctionSettings,
        scorer: HttpScorer | PythonScorer,
        claimed: store.Claimed,
    ) -> None:
        try:
            calls = await store.conversation(self.engine, claimed.trajectory_id)
            value = await scorer(payload(policy.name, function.name, claimed.trajectory_id, calls))
        except ScoringError as exc:
            self.failed += 1
            log.warning(
                "reward function %s of %s: trajectory %s, attempt %d: %s",
                function.name,
                policy.name,
                claimed.trajectory_id,
                claimed.attempt,
                exc,
            )
            await store.record_failure(self.engine, function, claimed, str(exc))
            return
        await store.record_score(self.engine, policy.name, function, claimed, value)
        self.scored += 1
