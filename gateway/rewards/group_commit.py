"""Group commit of single rewards: concurrent requests written together, each answered on its own.

A webhook posts one reward per run. Stored one transaction each, a reward costs about ten
statements and a commit, and at a few hundred requests a second the requests queue for the
pool's connections (the p99 grew to 400 ms and more). Here a request joins a queue; while
fewer than `max_in_flight` transactions run, one starts at once with everything queued (up to
`max_group` requests), so an idle gateway adds no wait at all, and under load each transaction
takes everything that arrived while the previous one ran: one set of statements for the group.

The group's transaction (gateway/store/rewards.py, `ingest_group`) keeps every request's
guarantees: a request refused by its policy, a replayed signature or the pending bound is left
out and answered with its own error; the others are stored exactly as if they had arrived one
after the other. A request is answered only after the group's COMMIT returned: a reward answered
200 is in PostgreSQL. When the transaction fails for a reason that one request's data may cause
(a statement error), the group is split and each request is retried alone, so that one bad
request fails only itself; when PostgreSQL is unreachable, every request of the group gets the
error (answered 503: nothing was confirmed stored, retry).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.store.rewards import Ingested, IntakeRequest, Outcome, ingest_group, store_unavailable

log = logging.getLogger(__name__)

# Two transactions in flight: one is prepared and sent while the other waits for PostgreSQL.
MAX_IN_FLIGHT = 2
# A bound on one transaction's size, so that its latency stays in the milliseconds.
MAX_GROUP = 256

_Waiting = tuple[IntakeRequest, "asyncio.Future[Ingested]"]


class GroupCommitter:
    """Writes the single-reward requests of one gateway process in groups."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        max_pending: int | None,
        max_group: int = MAX_GROUP,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        self.engine = engine
        self.max_pending = max_pending
        self.max_group = max_group
        self.max_in_flight = max_in_flight
        self._queue: deque[_Waiting] = deque()
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.groups = 0  # transactions run (for tests and benchmarks: requests / groups = mean group size)

    async def submit(self, request: IntakeRequest) -> Ingested:
        """Store one request's rewards with whatever else is waiting; raises what refuses it."""
        future: asyncio.Future[Ingested] = asyncio.get_running_loop().create_future()
        self._queue.append((request, future))
        if self._in_flight < self.max_in_flight:
            self._in_flight += 1
            task = asyncio.create_task(self._drain())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await future

    async def _drain(self) -> None:
        try:
            while self._queue:
                await self._commit(self._next_group())
        finally:
            self._in_flight -= 1

    def _next_group(self) -> list[_Waiting]:
        """The oldest waiting requests, up to `max_group`; a second request with a signature already
        in the group waits for the next one, which then knows whether the first kept it (a request
        refused in the group releases its signature)."""
        group: list[_Waiting] = []
        later: list[_Waiting] = []
        signatures: set[bytes] = set()
        while self._queue and len(group) < self.max_group:
            waiting = self._queue.popleft()
            signature = waiting[0].signature
            if signature is not None:
                if signature[0] in signatures:
                    later.append(waiting)
                    continue
                signatures.add(signature[0])
            group.append(waiting)
        self._queue.extendleft(reversed(later))
        return group

    async def _commit(self, group: list[_Waiting]) -> None:
        waiting = [(request, future) for request, future in group if not future.done()]  # done: cancelled
        if not waiting:
            return
        self.groups += 1
        try:
            outcomes: list[Outcome] = await ingest_group(
                self.engine, [request for request, _ in waiting], max_pending=self.max_pending
            )
        except Exception as error:
            if len(waiting) > 1 and not store_unavailable(error):
                log.warning("a group of %d rewards failed (%r); storing each alone", len(waiting), error)
                for one in waiting:
                    await self._commit([one])
                return
            for _, future in waiting:
                if not future.done():
                    future.set_exception(error)
            return
        except BaseException:  # cancelled at shutdown: the waiting requests must not hang
            for _, future in waiting:
                future.cancel()
            raise
        for (_, future), outcome in zip(waiting, outcomes, strict=True):
            if future.done():
                continue
            if isinstance(outcome, Exception):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
