"""The recorder: every completed call redacted, journaled, shipped into PostgreSQL and stitched.

A handler hands `record` the call's record before the call's last byte is sent; from there the
call is never lost: the journal (gateway/journal/) holds it on disk until the shipper has
stored it, and a record PostgreSQL refuses as data is set aside, not retried forever. Calls
that wait for a parent another process recorded are settled by the stitcher, which the
shipper wakes. Needs the store and the settings only, not the gateway's app: a test or a tool
can build one on its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.settings import Settings, resolve_secret
from apprentice.store.secrets import instance_secret
from gateway import metrics
from gateway.journal.rejected import set_aside
from gateway.journal.shipper import JournalShipper
from gateway.journal.writer import JournalWriter
from gateway.redaction.record import RecordRedactor
from gateway.store.calls import insert_call_lines, stitch_pending
from gateway.workers import PeriodicWorker

if TYPE_CHECKING:
    from gateway.tracing.exporter import CallTracer

log = logging.getLogger(__name__)

# The placeholders' HMAC key when redaction.key is not configured (docs/privacy.md).
REDACTION_SECRET = "redaction"
PENDING_MARK = b'"stitch_pending":true'
STITCH_INTERVAL_S = 0.5
# Pending calls older than the open window are settled even when no new one arrives.
SETTLE_INTERVAL_S = 30.0


class Recorder:
    """Journal, shipper, stitcher and redactor of one gateway process.

    `on_shipped`: called after each stored batch (the reward linker's wake: rewards that waited
    for these calls can link now). `tracer`: offered every record, when tracing is configured."""

    def __init__(
        self,
        settings: Settings,
        engine: AsyncEngine,
        *,
        on_shipped: Callable[[], None] = lambda: None,
        tracer: CallTracer | None = None,
    ) -> None:
        self.settings, self.engine, self.on_shipped, self.tracer = settings, engine, on_shipped, tracer
        self.journal = JournalWriter(
            settings.journal_dir,
            max_bytes=settings.journal.segment_max_bytes,
            max_age_s=settings.journal.segment_max_age_s,
            fsync=settings.journal.fsync,
        )
        self.shipper = JournalShipper(
            self.journal,
            self._ship,
            batch_rows=settings.journal.ship_batch_rows,
            interval_s=settings.journal.ship_interval_s,
        )
        # Woken when a shipped batch holds calls waiting for their parent; the wake delay lets
        # the other processes' parents land first.
        self.stitcher = PeriodicWorker(
            "trajectory-stitcher", self._stitch_pass, interval_s=SETTLE_INTERVAL_S, wake_delay_s=STITCH_INTERVAL_S
        )
        # Redacts every record before it is journaled (gateway/redaction); None: nothing to redact.
        self.redactor: RecordRedactor | None = None

    @property
    def workers(self) -> list[PeriodicWorker]:
        return [self.shipper.worker, self.stitcher]

    async def start(self) -> None:
        self.redactor = await self._redactor()
        self.journal.open()
        self.stitcher.start()
        self.shipper.start()

    async def stop(self) -> None:
        """Ship what is left (the shipper drains), then stop stitching and close the journal."""
        await self.shipper.stop()
        await self.stitcher.stop()
        self.journal.close()

    def record(self, record: dict[str, Any], *, ship_now: bool = False) -> None:
        """Journal a completed call (synchronous: done before the call's last byte is sent),
        redacted first: neither the journal nor the store ever holds what redaction replaces.
        `ship_now`: another process waits for this record in the store (see JournalShipper.note_record)."""
        if self.redactor is not None:
            record = self.redactor.apply(record)
        self.journal.append(record)
        metrics.JOURNALED.inc()
        self.shipper.note_record(ship_now=ship_now)
        if self.tracer is not None:
            self.tracer.offer(record)

    def redact_early(self, call_id: object, trajectory_id: object, policy: str | None, *bodies: Any) -> None:
        """Start redacting a call's request bodies while the upstream works (its record, made
        later from the same objects, takes the result: see gateway/redaction/record.py)."""
        if self.redactor is not None:
            self.redactor.early(str(call_id), str(trajectory_id), policy, *bodies)

    async def _redactor(self) -> RecordRedactor | None:
        settings = self.settings
        redacts = settings.redaction.enabled or any(
            policy.redaction is not None and policy.redaction.enabled for policy in settings.policies
        )
        if not redacts:
            return None
        key = resolve_secret(settings.redaction.key)
        secret = key.encode() if key else await instance_secret(self.engine, REDACTION_SECRET)
        redactor = RecordRedactor(settings, secret)
        return redactor if redactor.active else None

    async def _ship(self, lines: list[bytes]) -> int:
        try:
            shipped = await insert_call_lines(self.engine, lines)
        except Exception:
            metrics.SHIP_FAILURES.inc()
            raise
        for rejected in shipped.rejected:
            set_aside(self.settings.journal_dir, rejected.line, rejected.reason)
            metrics.SHIP_REJECTED.inc()
        count = shipped.stored
        metrics.SHIPPED.inc(count)
        self.on_shipped()  # no query here: the linker probes for pending rewards itself
        metrics.JOURNAL_BACKLOG.set(self.shipper.stats.backlog_bytes)
        if any(PENDING_MARK in line for line in lines):
            self.stitcher.wake()
        return count

    async def _stitch_pass(self) -> None:
        merged = await stitch_pending(self.engine, self.settings.stitching.open_window_s)
        if merged:
            log.debug("stitched %d trajectories split across processes", merged)
            self.stitcher.wake()  # a later parent may have become known too
