"""Hears the lifecycle's NOTIFY of an adapter transition, so a gateway switches versions at once.

Every transition (apprentice/promotion/lifecycle.py) sends `pg_notify` on NOTIFY_CHANNEL in
its transaction; PostgreSQL delivers it at commit. Each gateway process holds one extra
connection that LISTENs there (psycopg, autocommit) and, on a notification, wakes the
version poll, which re-reads the serving versions right away instead of at its next tick.

The poll stays as the fallback: a notification sent while this connection was down is lost,
so every (re)connect also wakes the poll, and a status changed by hand (no NOTIFY) is still
seen within `adapter_poll_interval_s`. The listener runs as a `PeriodicWorker` whose step
waits up to LISTEN_STEP_S for notifications; a dropped connection fails the step, and the
worker reconnects with back-off. TCP keepalives make a silently dead connection fail too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from apprentice.promotion.lifecycle import NOTIFY_CHANNEL
from apprentice.store.engine import libpq_url
from gateway.workers import PeriodicWorker

log = logging.getLogger(__name__)

# One step's wait for notifications: also how often an idle listener wakes up.
LISTEN_STEP_S = 10.0
CONNECT_TIMEOUT_S = 5
# TCP keepalives: a connection whose peer vanished without a word fails after about 10 + 3 * 5 s.
KEEPALIVE_IDLE_S = 10
KEEPALIVE_INTERVAL_S = 5
KEEPALIVE_COUNT = 3


class AdapterNotifications:
    """LISTEN on NOTIFY_CHANNEL and call `on_notify` for every transition (and every reconnect)."""

    def __init__(
        self,
        database_url: str,
        on_notify: Callable[[], None],
        *,
        channel: str = NOTIFY_CHANNEL,
        wait_s: float = LISTEN_STEP_S,
    ) -> None:
        self.conninfo = libpq_url(database_url)
        self.on_notify = on_notify
        self.channel = channel
        self.wait_s = wait_s
        self.received = 0
        self._connection: psycopg.AsyncConnection[TupleRow] | None = None
        # The step is a wait on a socket: cancelling it at stop is safe, so stop does not wait.
        self.worker = PeriodicWorker(
            "adapter-notify-listener", self.listen_once, interval_s=0.0, stop_timeout_s=0.0, first_step_at_once=True
        )

    def start(self) -> None:
        self.worker.start()

    async def stop(self) -> None:
        await self.worker.stop()
        await self._close()

    async def listen_once(self) -> None:
        """One step: connect when not connected (a step of its own, so that the worker's health
        shows a reconnect at once), else pass on the notifications that arrive within `wait_s`."""
        try:
            connection = self._connection
            if connection is None or connection.closed:
                await self._connect()
                return
            async for _ in connection.notifies(timeout=self.wait_s):
                self.received += 1
                self.on_notify()
        except BaseException:
            await self._close()
            raise

    async def _connect(self) -> None:
        connection = await psycopg.AsyncConnection.connect(
            self.conninfo,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT_S,
            keepalives=1,
            keepalives_idle=KEEPALIVE_IDLE_S,
            keepalives_interval=KEEPALIVE_INTERVAL_S,
            keepalives_count=KEEPALIVE_COUNT,
        )
        self._connection = connection  # closed by listen_once if LISTEN fails
        await connection.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
        self.on_notify()  # whatever was announced while we were not listening

    async def _close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None and not connection.closed:
            try:
                await connection.close()
            except Exception as exc:  # already broken: nothing left to release
                log.debug("closing the NOTIFY connection failed (%s)", exc)
