"""PeriodicWorker (gateway/workers.py) on a real event loop: period, wake, back-off, health, stop."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from gateway import metrics
from gateway.workers import FAILING_AFTER, PeriodicWorker

T = TypeVar("T")


def run(coroutine_function: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(coroutine_function())  # type: ignore[arg-type]


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.002)


def test_steps_every_interval_and_at_once_when_woken() -> None:
    async def scenario() -> None:
        times: list[float] = []

        async def step() -> None:
            times.append(time.monotonic())

        worker = PeriodicWorker("test-period", step, interval_s=0.05)
        started = time.monotonic()
        worker.start()
        await until(lambda: len(times) >= 3)
        assert times[0] - started >= 0.045, "the first step waits one interval"
        worker.interval_s = 60.0
        await asyncio.sleep(0.06)  # the step in the old period happens; the next pause is 60 s
        count, woken = len(times), time.monotonic()
        worker.wake()
        await until(lambda: len(times) > count)
        assert times[-1] - woken < 0.05
        await worker.stop()
        assert not worker.running and worker.health.consecutive_failures == 0
        assert worker.health.last_success_at is not None

    run(scenario)


def test_wake_delay_gathers_and_a_wake_during_a_step_runs_another() -> None:
    async def scenario() -> None:
        times: list[float] = []
        release = asyncio.Event()

        async def step() -> None:
            times.append(time.monotonic())
            if len(times) == 1:
                await release.wait()

        worker = PeriodicWorker("test-wake", step, interval_s=60.0, wake_delay_s=0.05)
        worker.start()
        woken = time.monotonic()
        worker.wake()
        worker.wake()
        await until(lambda: len(times) == 1)
        assert times[0] - woken >= 0.045, "a wake waits wake_delay_s for more work"
        worker.wake()  # during the step
        release.set()
        await until(lambda: len(times) == 2)
        await asyncio.sleep(0.1)
        assert len(times) == 2, "many wakes, one step each"
        await worker.stop()

    run(scenario)


def test_backoff_doubles_to_its_cap_health_records_and_success_resets() -> None:
    async def scenario() -> None:
        times: list[float] = []
        fail = True

        async def step() -> None:
            times.append(time.monotonic())
            if fail:
                raise ConnectionError(f"store down (try {len(times)})")

        failures_before = metrics.WORKER_FAILURES.labels("test-backoff")._value.get()
        worker = PeriodicWorker(
            "test-backoff", step, interval_s=0.01, min_backoff_s=0.02, max_backoff_s=0.08, first_step_at_once=True
        )
        worker.start()
        await until(lambda: len(times) >= 6)
        gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
        for gap, expected in zip(gaps, (0.02, 0.04, 0.08, 0.08, 0.08), strict=False):  # the first five gaps
            assert expected * 0.9 <= gap < expected + 0.06, (gaps, expected)
        count = len(times)
        await until(lambda: len(times) > count)
        worker.wake()  # just after a failure: a wake does not cut the back-off (0.08 s) short
        count = len(times)
        await asyncio.sleep(0.03)
        assert len(times) == count
        health = worker.health
        assert health.failing and health.consecutive_failures >= FAILING_AFTER and health.last_success_at is None
        assert health.last_error is not None and health.last_error.startswith("ConnectionError: store down")
        report = health.report(time.time())
        assert report["ok"] is False and report["seconds_since_success"] is None
        assert metrics.WORKER_FAILURES.labels("test-backoff")._value.get() - failures_before == health.failures
        assert metrics.WORKER_CONSECUTIVE_FAILURES.labels("test-backoff")._value.get() == health.consecutive_failures

        fail = False
        await until(lambda: worker.health.consecutive_failures == 0)
        assert not worker.health.failing and worker.health.failures >= 6
        assert metrics.WORKER_CONSECUTIVE_FAILURES.labels("test-backoff")._value.get() == 0
        assert metrics.WORKER_LAST_SUCCESS.labels("test-backoff")._value.get() == worker.health.last_success_at
        await worker.stop()

    run(scenario)


def test_backoff_never_below_the_interval() -> None:
    worker = PeriodicWorker(
        "test-backoff-interval", asyncio.sleep, interval_s=1.0, min_backoff_s=0.25, max_backoff_s=5.0
    )
    delays = []
    for failures in range(1, 8):
        worker.health.consecutive_failures = failures
        delays.append(worker.backoff_s())
    assert delays == [1.0, 1.0, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_stop_lets_a_step_in_flight_finish() -> None:
    async def scenario() -> None:
        finished: list[bool] = []

        async def step() -> None:
            await asyncio.sleep(0.05)
            finished.append(True)

        worker = PeriodicWorker("test-finish", step, interval_s=60.0, first_step_at_once=True)
        worker.start()
        await asyncio.sleep(0.01)
        await worker.stop()
        assert finished == [True] and not worker.running and worker.health.last_success_at is not None

    run(scenario)


def test_stop_cancels_a_step_that_overruns_the_stop_timeout() -> None:
    async def scenario() -> None:
        cancelled: list[bool] = []

        async def step() -> None:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.append(True)
                raise

        worker = PeriodicWorker("test-cancel", step, interval_s=60.0, stop_timeout_s=0.05, first_step_at_once=True)
        worker.start()
        await asyncio.sleep(0.01)
        started = time.monotonic()
        await worker.stop()
        assert 0.04 <= time.monotonic() - started < 0.5
        assert cancelled == [True] and not worker.running

    run(scenario)


def test_stop_ends_the_loop_when_a_step_swallows_the_cancellation() -> None:
    """The pitfall of gh-86296: a wait_for inside a step may eat the cancel. The stop flag, checked
    after every step, still ends the loop, at once rather than after another interval."""

    async def scenario() -> None:
        steps: list[str] = []

        async def step() -> None:
            steps.append("started")
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                steps.append("swallowed")  # returns normally, as a swallowed cancellation does

        worker = PeriodicWorker("test-swallow", step, interval_s=0.0, stop_timeout_s=0.02, first_step_at_once=True)
        worker.start()
        await asyncio.sleep(0.01)
        started = time.monotonic()
        await worker.stop()
        assert time.monotonic() - started < 0.5
        assert steps == ["started", "swallowed"] and not worker.running

    run(scenario)


def test_stop_gives_up_on_a_step_that_refuses_to_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gateway.workers.CANCEL_GRACE_S", 0.02)

    async def scenario() -> None:
        release = asyncio.Event()

        async def stubborn() -> None:
            while not release.is_set():
                try:
                    await release.wait()
                except asyncio.CancelledError:
                    continue

        worker = PeriodicWorker(
            "test-stubborn", stubborn, interval_s=60.0, stop_timeout_s=0.02, first_step_at_once=True
        )
        worker.start()
        await asyncio.sleep(0.01)
        started = time.monotonic()
        await worker.stop()
        assert time.monotonic() - started < 0.5, "stop returns even though the task lives on"
        assert worker.running
        release.set()
        await until(lambda: not worker.running)

    run(scenario)


def test_stop_while_idle_is_immediate_and_stop_before_start_is_harmless() -> None:
    async def scenario() -> None:
        async def step() -> None:
            return None

        idle = PeriodicWorker("test-idle", step, interval_s=60.0)
        await idle.stop()
        idle.start()
        await asyncio.sleep(0.01)
        started = time.monotonic()
        await idle.stop()
        assert time.monotonic() - started < 0.05 and not idle.running
        idle.start()  # a stopped worker can run again
        assert idle.running
        with pytest.raises(RuntimeError):
            idle.start()
        await idle.stop()

    run(scenario)
