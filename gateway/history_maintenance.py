"""The gateway's history maintenance: partitions of `calls` created ahead and dropped by
retention (apprentice/store/history.py does the work; docs/history.md).

Every gateway process runs it; the store's advisory lock lets one do the work while the others'
passes return at once. It runs at start (a process started after days down still finds today's
partition) and then every `history.maintenance_interval_s`.
"""

from __future__ import annotations

import logging

from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.settings import HistorySettings
from apprentice.store import history
from gateway import metrics
from gateway.store.connection import driver_connection
from gateway.workers import PeriodicWorker

log = logging.getLogger(__name__)


class HistoryMaintenance:
    def __init__(self, engine: AsyncEngine, settings: HistorySettings) -> None:
        self.engine = engine
        self.settings = settings
        self.worker = PeriodicWorker(
            "history-maintenance", self.step, interval_s=settings.maintenance_interval_s, first_step_at_once=True
        )

    def start(self) -> None:
        self.worker.start()

    async def stop(self) -> None:
        await self.worker.stop()

    async def step(self) -> history.MaintenanceReport:
        async with self.engine.connect() as connection:
            pg = await driver_connection(connection)
            report = await history.maintain(pg, self.settings)
            metrics.HISTORY_PARTITIONS.set(len(await history.partitions(pg)))
        metrics.HISTORY_PARTITIONS_CREATED.inc(len(report.created))
        metrics.HISTORY_PARTITIONS_DROPPED.inc(len(report.dropped))
        metrics.HISTORY_CALLS_DROPPED.inc(report.rows_dropped + report.default_rows_deleted)
        metrics.HISTORY_CALLS_KEPT.inc(report.rows_kept)
        return report
