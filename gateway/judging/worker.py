"""The judge's background worker: every poll, each policy's ready groups are claimed and judged.

Runs in every gateway process; the store's claims keep them from judging a group twice or
exceeding a policy's concurrency and hourly budget together. A step judges the chunks it
claimed concurrently and returns when they are done; the next step claims more.
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.settings import JudgeSettings, PolicySettings, Settings
from gateway import metrics
from gateway.judging import store
from gateway.judging.client import JudgeClient
from gateway.judging.job import judge_chunk
from gateway.judging.rubric import rubric_hash, rubric_text
from gateway.workers import PeriodicWorker

log = logging.getLogger(__name__)


def judged_policies(settings: Settings) -> list[tuple[PolicySettings, JudgeSettings]]:
    return [(p, p.judge) for p in settings.policies if p.judge is not None]


class JudgeWorker:
    def __init__(self, engine: AsyncEngine, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings
        self.policies = judged_policies(settings)
        interval = min((judge.poll_interval_s for _, judge in self.policies), default=60.0)
        self.worker = PeriodicWorker("judge", self.step, interval_s=interval, first_step_at_once=True)
        self._clients: dict[str, JudgeClient] = {}

    @property
    def enabled(self) -> bool:
        return bool(self.policies)

    def start(self) -> None:
        if self.enabled:
            self._clients = {p.name: JudgeClient(self.settings, j) for p, j in self.policies}
            self.worker.start()

    async def stop(self) -> None:
        if self.enabled:
            await self.worker.stop()
            for client in self._clients.values():
                await client.close()

    async def step(self) -> None:
        results = await asyncio.gather(*(self._judge_policy(p, j) for p, j in self.policies), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            raise failures[0]

    async def _judge_policy(self, policy: PolicySettings, judge: JudgeSettings) -> None:
        rubric = rubric_text(judge)
        digest = rubric_hash(rubric)
        ready = await store.find_ready_groups(self.engine, policy, judge, digest)
        metrics.JUDGE_GROUPS_READY.labels(policy.name).set(len(ready))
        if not ready:
            metrics.JUDGE_BUDGET_EXHAUSTED.labels(policy.name).set(0)
            return
        outcome = await store.claim(
            self.engine, policy, judge, digest, ready, mode=judge.mode, lease_s=judge.timeout_s * 2
        )
        metrics.JUDGE_BUDGET_EXHAUSTED.labels(policy.name).set(1 if outcome.budget_exhausted else 0)
        if outcome.budget_exhausted:
            log.info("judge of %s waits: its hourly budget is spent (%d groups ready)", policy.name, len(ready))
        client = self._clients[policy.name]
        await asyncio.gather(
            *(
                judge_chunk(
                    self.engine,
                    client,
                    policy,
                    judge,
                    claim,
                    rubric=rubric,
                    max_comment_chars=self.settings.rewards.max_comment_chars,
                )
                for claim in outcome.claims
            )
        )
        if outcome.claims and len(outcome.claims) < len(ready) and not outcome.budget_exhausted:
            self.worker.wake()  # more are ready and this process's claims are done: claim again now
