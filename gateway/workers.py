"""One way to run a gateway process's background jobs: `PeriodicWorker`.

Each background job (API key refresh, adapter version poll, adapter NOTIFY listener, journal
shipper, trajectory stitcher, reward linker) is a step run again and again: every
`interval_s`, at once when something calls `wake()`, later and later while it fails. They
used to be hand-made loops that each started, stopped and reported failure differently;
here the mechanics are written once and the jobs keep only their step.

Stopping uses a flag, and cancel() only as a last resort. Python 3.11's `asyncio.wait_for`
can swallow a cancellation that lands while the awaited event fires (gh-86296), so a loop
stopped by cancel() alone can run on and keep shutdown waiting forever. `stop()` sets a flag
that the loop checks before and after every step, lets a step in flight finish for up to
`stop_timeout_s`, and only then cancels it; a swallowed cancellation still ends the loop at
its next check, and a step that ignores cancellation altogether is abandoned after a bounded
wait instead of hanging the process.

Health (`WorkerHealth`) is kept per worker and exported to /readyz and Prometheus: a worker
that keeps failing is named with its last error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gateway import metrics

log = logging.getLogger(__name__)

# A worker is reported failing after this many failed steps in a row: one failure is often a
# blip (a dropped pooled connection) that the next step recovers from.
FAILING_AFTER = 3
MIN_BACKOFF_S = 0.25
MAX_BACKOFF_S = 5.0
STOP_TIMEOUT_S = 5.0
# After the stop timeout: how often, and how long each time, to cancel a step that will not end.
CANCEL_ATTEMPTS = 3
CANCEL_GRACE_S = 1.0
# uvloop's timers have millisecond resolution: a pause this close to its end is over.
PAUSE_RESOLUTION_S = 0.001

Step = Callable[[], Awaitable[object]]


@dataclass
class WorkerHealth:
    """What a worker's steps have done lately; times are wall-clock (time.time())."""

    last_success_at: float | None = None
    last_failure_at: float | None = None
    consecutive_failures: int = 0
    failures: int = 0
    last_error: str | None = None

    @property
    def failing(self) -> bool:
        return self.consecutive_failures >= FAILING_AFTER

    def report(self, now: float) -> dict[str, object]:
        since = None if self.last_success_at is None else round(now - self.last_success_at, 3)
        return {
            "ok": not self.failing,
            "consecutive_failures": self.consecutive_failures,
            "failures": self.failures,
            "seconds_since_success": since,
            "last_error": self.last_error,
        }


class PeriodicWorker:
    """Runs `step` every `interval_s` in its own task, until `stop()`.

    - `wake()` runs the next step at once (after `wake_delay_s`, which lets more work gather
      into one step); a wake during a step runs another step right after it.
    - A step fails by raising. The next try waits the back-off: `min_backoff_s` doubling per
      failure in a row, never less than the interval and never more than `max_backoff_s`
      (a job with a long interval therefore retries sooner while it fails). A wake does not
      cut a back-off short; it makes the step run as soon as the back-off ends.
    - `first_step_at_once`: the first step runs at start rather than after one interval.
    """

    def __init__(
        self,
        name: str,
        step: Step,
        *,
        interval_s: float,
        wake_delay_s: float = 0.0,
        min_backoff_s: float = MIN_BACKOFF_S,
        max_backoff_s: float = MAX_BACKOFF_S,
        stop_timeout_s: float = STOP_TIMEOUT_S,
        first_step_at_once: bool = False,
    ) -> None:
        self.name = name
        self.step = step
        self.interval_s = interval_s
        self.wake_delay_s = wake_delay_s
        self.min_backoff_s = min_backoff_s
        self.max_backoff_s = max_backoff_s
        self.stop_timeout_s = stop_timeout_s
        self.first_step_at_once = first_step_at_once
        self.health = WorkerHealth()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._wanted = False
        # Set by wake() and stop(); the flags above say which.
        self._signal = asyncio.Event()
        self._failures_metric = metrics.WORKER_FAILURES.labels(name)
        self._consecutive_metric = metrics.WORKER_CONSECUTIVE_FAILURES.labels(name)
        self._last_success_metric = metrics.WORKER_LAST_SUCCESS.labels(name)

    # ---- control ---------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        if self.running:
            raise RuntimeError(f"worker {self.name} is already running")
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name=self.name)

    def wake(self) -> None:
        self._wanted = True
        self._signal.set()

    async def stop(self) -> None:
        """Let a step in flight finish (up to `stop_timeout_s`), then cancel it; never hangs."""
        self._stopping = True
        self._signal.set()
        task = self._task
        if task is None:
            return
        done, _ = await asyncio.wait({task}, timeout=self.stop_timeout_s)
        if not done and self.stop_timeout_s > 0:
            log.warning(
                "%s: the step in flight did not finish within %.1fs of stop; cancelling it",
                self.name,
                self.stop_timeout_s,
            )
        for _ in range(CANCEL_ATTEMPTS):
            if done:
                break
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=CANCEL_GRACE_S)
        if not done:
            log.error("%s did not stop after %d cancellations; abandoning it", self.name, CANCEL_ATTEMPTS)
            return
        if not task.cancelled() and task.exception() is not None:
            log.error("%s ended with an error", self.name, exc_info=task.exception())

    # ---- steps -----------------------------------------------------------------------
    async def run_once(self) -> bool:
        """Run one step now and record its outcome; True when it succeeded."""
        try:
            await self.step()
        except Exception as exc:
            self._record_failure(exc)
            return False
        self._record_success()
        return True

    def backoff_s(self) -> float:
        """The wait before the next try, after `health.consecutive_failures` failures in a row."""
        doublings = min(max(self.health.consecutive_failures - 1, 0), 30)
        return min(self.max_backoff_s, max(self.interval_s, self.min_backoff_s * 2.0**doublings))

    async def _run(self) -> None:
        succeeded = await self.run_once() if self.first_step_at_once else True
        while not self._stopping:
            if succeeded:
                await self._pause(self.interval_s, wake_ends_it=True)
            else:
                await self._pause(self.backoff_s(), wake_ends_it=False)
            if self._wanted and self.wake_delay_s > 0 and not self._stopping:
                await self._pause(self.wake_delay_s, wake_ends_it=False)
            if self._stopping:
                return
            self._wanted = False
            succeeded = await self.run_once()

    async def _pause(self, seconds: float, *, wake_ends_it: bool) -> None:
        """Sleep until `seconds` pass or the worker is stopped (or woken, if `wake_ends_it`).

        No wait_for (see the module's docstring): a timer sets the same event that wake() and
        stop() set, and a plain Event.wait() passes any cancellation straight through.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while not self._stopping and not (wake_ends_it and self._wanted):
            remaining = deadline - loop.time()
            if remaining <= PAUSE_RESOLUTION_S:
                return
            self._signal.clear()
            timer = loop.call_later(remaining, self._signal.set)
            try:
                await self._signal.wait()
            finally:
                timer.cancel()

    def _record_success(self) -> None:
        now = time.time()
        self.health.last_success_at = now
        self._last_success_metric.set(now)
        if self.health.consecutive_failures:
            log.info("%s recovered after %d failed steps", self.name, self.health.consecutive_failures)
            self.health.consecutive_failures = 0
            self._consecutive_metric.set(0)

    def _record_failure(self, exc: Exception) -> None:
        health = self.health
        health.failures += 1
        health.consecutive_failures += 1
        health.last_failure_at = time.time()
        health.last_error = f"{type(exc).__name__}: {exc}"[:500]
        self._failures_metric.inc()
        self._consecutive_metric.set(health.consecutive_failures)
        if not self._stopping:
            log.warning(
                "%s failed (%s); retrying in %.2fs (%d failures in a row)",
                self.name,
                health.last_error,
                self.backoff_s(),
                health.consecutive_failures,
            )
