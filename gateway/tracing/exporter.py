"""The tracing queue and its export worker: spans leave the gateway off the hot path.

`offer` (called by `GatewayState.record` for every journaled call: chat completions, Responses,
Messages, native forwards) copies the span's few fields into a bounded deque and returns; when
the deque is full the call is dropped and counted (`apprentice_tracing_dropped_total`) instead
of waiting. A `PeriodicWorker` ("tracing-exporter", on /readyz like the others: a failing
collector makes the gateway "degraded", never unready) takes batches of `batch_size` every
`export_interval_s` (at once when a batch is full) and builds and posts the spans in a thread of
its own, so neither the OTLP encoding nor the HTTP request runs on the event loop. A batch the
collector does not take (after the exporter's own retries, within `export_timeout_s`) is
counted as failed and not retried again: the worker backs off, and meanwhile the queue, not the
calls, absorbs the outage. At shutdown what is queued is exported for at most
`shutdown_timeout_s`; what is left then is counted as dropped.

The OpenTelemetry SDK is imported here only when a `CallTracer` is made, that is when tracing
is configured (gateway/tracing/spans.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from apprentice.settings import ConfigError, Settings, TracingSettings
from gateway import metrics
from gateway.tracing.items import CallItem, RewardItem, call_item
from gateway.workers import PeriodicWorker

if TYPE_CHECKING:
    from gateway.store.rewards import NewReward, StoredReward
    from gateway.tracing.spans import SpanExport

log = logging.getLogger(__name__)

WORKER_NAME = "tracing-exporter"
Item = CallItem | RewardItem


class ExportFailed(RuntimeError):
    pass


def _span_export(settings: Settings, tracing: TracingSettings) -> SpanExport:
    try:
        from gateway.tracing.spans import SpanExport
    except ImportError as exc:
        raise ConfigError(
            f"tracing is configured but OpenTelemetry is not installed ({exc}): "
            "pip install 'apprentice[tracing]' (opentelemetry-sdk, opentelemetry-exporter-otlp-proto-http)"
        ) from exc
    return SpanExport(settings, tracing)


class CallTracer:
    def __init__(self, settings: Settings, tracing: TracingSettings) -> None:
        self.tracing = tracing
        self.queue_size = tracing.queue_size
        self.batch_size = tracing.batch_size
        self.include_content = tracing.include_content
        self.export = _span_export(settings, tracing)
        self._queue: deque[Item] = deque()
        self._executor: ThreadPoolExecutor | None = None
        self.worker = PeriodicWorker(WORKER_NAME, self._step, interval_s=tracing.export_interval_s)
        log.info("tracing: exporting spans to %s", self.export.endpoint)

    @property
    def queued(self) -> int:
        return len(self._queue)

    # ---- the hot path ----------------------------------------------------------------
    def offer(self, record: dict[str, Any]) -> None:
        """Queue a journaled call's span; never waits (a full queue drops it and counts)."""
        queue = self._queue
        if len(queue) >= self.queue_size:
            metrics.TRACING_DROPPED.inc()
            return
        queue.append(call_item(record, self.include_content))
        if len(queue) == self.batch_size:
            self.worker.wake()

    def offer_rewards(self, items: Sequence[NewReward], stored: Sequence[StoredReward]) -> None:
        """Queue the spans of rewards just stored (`stored` answers `items` in order)."""
        for new, reward in zip(items, stored, strict=False):
            if len(self._queue) >= self.queue_size:
                metrics.TRACING_DROPPED.inc()
                continue
            self._queue.append(
                RewardItem(
                    reward_id=reward.id,
                    trajectory_id=reward.trajectory_id,
                    status=reward.status,
                    name=reward.name,
                    value=reward.value,
                    metrics=dict(reward.metrics),
                    source=new.source,
                    tenant=new.tenant,
                    target_kind=reward.target_kind,
                    target=reward.target,
                    group_id=reward.group_id,
                    received_at=reward.received_at,
                    comment=reward.comment if self.include_content else None,
                )
            )
        if len(self._queue) >= self.batch_size:
            self.worker.wake()

    # ---- export ----------------------------------------------------------------------
    def start(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="otlp-export")
        self.worker.start()

    async def _export_batch(self, limit: int | None = None) -> int:
        count = min(self.batch_size, len(self._queue), limit if limit is not None else len(self._queue))
        batch = [self._queue.popleft() for _ in range(count)]
        loop = asyncio.get_running_loop()
        try:
            ok = await loop.run_in_executor(self._executor, self.export.export, batch)
        except asyncio.CancelledError:
            # Stopped while waiting (shutdown's time ran out): the thread may still send them.
            metrics.TRACING_DROPPED.inc(count)
            raise
        except Exception as exc:
            metrics.TRACING_FAILED.inc(count)
            raise ExportFailed(f"{count} spans not exported: {type(exc).__name__}: {exc}") from exc
        if not ok:
            metrics.TRACING_FAILED.inc(count)
            raise ExportFailed(f"{count} spans not exported: the collector at {self.export.endpoint} refused them")
        metrics.TRACING_EXPORTED.inc(count)
        return count

    async def _step(self) -> None:
        """Export what was queued when the step began (not what arrives meanwhile: a steady
        trickle would otherwise keep the worker posting tiny batches back to back)."""
        pending = len(self._queue)
        while pending > 0 and self._queue:
            pending -= await self._export_batch(pending)

    async def stop(self) -> None:
        """Stop the worker, export what is queued (for at most shutdown_timeout_s), close."""
        await self.worker.stop()
        deadline = time.monotonic() + self.tracing.shutdown_timeout_s
        try:
            while self._queue and (remaining := deadline - time.monotonic()) > 0:
                await asyncio.wait_for(self._export_batch(), remaining)
        except (ExportFailed, asyncio.TimeoutError) as exc:
            log.warning("tracing: the final export stopped: %s", exc)
        if self._queue:
            log.warning("tracing: %d spans not exported at shutdown", len(self._queue))
            metrics.TRACING_DROPPED.inc(len(self._queue))
            self._queue.clear()
        self.export.shutdown()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)


def make_tracer(settings: Settings) -> CallTracer | None:
    """A tracer when the settings have a `tracing` section, else None (OpenTelemetry unloaded)."""
    return CallTracer(settings, settings.tracing) if settings.tracing is not None else None
