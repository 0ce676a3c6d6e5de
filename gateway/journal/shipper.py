"""Moves journal segments into PostgreSQL in batches, in order, exactly once.

Exactly once: every call has a gateway-made UUID primary key and is inserted with
ON CONFLICT DO NOTHING, and a segment's shipped offset is saved (in a `.offset` file beside
it) only after the batch commits. A crash between the two re-ships a batch that the
database then ignores. While PostgreSQL is down the shipper retries with backoff and the
journal grows; when it is back the backlog drains oldest segment first. The loop is a
`PeriodicWorker` (gateway/workers.py): a pass every `interval_s`, at once when a batch fills up.

Locks: a writer holds an flock on its active segment; a shipper holds an flock on the
segment's `.offset` file while it ships. So each segment has one shipper at a time, and a
segment still being written is shipped only by the process that writes it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from gateway.journal.writer import SEGMENT_SUFFIX, JournalWriter
from gateway.workers import PeriodicWorker

log = logging.getLogger(__name__)

# ship(lines) inserts the complete journal lines given, in one transaction.
ShipFunction = Callable[[list[bytes]], Awaitable[int]]

OFFSET_SUFFIX = ".offset"
RESCAN_INTERVAL_S = 5.0
# At shutdown, how long a batch in flight may take before it is cancelled (safe: its offset is
# saved only after the commit, and a re-shipped row is ignored by ON CONFLICT DO NOTHING).
STOP_TIMEOUT_S = 10.0


@dataclass
class ShipperStats:
    shipped_rows: int = 0
    failed_batches: int = 0
    backlog_bytes: int = 0
    last_error: str | None = None
    last_success_at: float | None = None


def _read_offset(fd: int) -> int:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 64).strip()
    return int(raw) if raw else 0


def _write_offset(fd: int, offset: int) -> None:
    data = str(offset).encode()
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, data.ljust(20))


class _LockedSegment:
    """A segment this shipper may ship now: its `.offset` file is locked by us."""

    def __init__(self, path: Path, offset_fd: int, segment_fd: int | None) -> None:
        self.path = path
        self.offset_fd = offset_fd
        self.segment_fd = segment_fd  # held only for sealed segments, to keep writers out

    @property
    def offset_path(self) -> Path:
        return self.path.with_name(self.path.name + OFFSET_SUFFIX)

    def release(self) -> None:
        os.close(self.offset_fd)
        if self.segment_fd is not None:
            os.close(self.segment_fd)


class JournalShipper:
    def __init__(self, writer: JournalWriter, ship: ShipFunction, *, batch_rows: int, interval_s: float) -> None:
        self.writer = writer
        self.directory = writer.directory
        self.ship = ship
        self.batch_rows = batch_rows
        self.interval_s = interval_s
        self.stats = ShipperStats()
        self.worker = PeriodicWorker(
            "journal-shipper", self._ship_pass, interval_s=interval_s, stop_timeout_s=STOP_TIMEOUT_S
        )
        self._unshipped = 0
        self._foreign: list[Path] = []
        self._last_scan = float("-inf")
        self._scanned_active: Path | None = None
        # (active segment, offset) once everything written to it so far is shipped.
        self._own_shipped: tuple[Path | None, int] = (None, -1)
        self._wake_threshold = max(1, batch_rows // 4)

    # ---- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        self.worker.start()

    def wake(self) -> None:
        self.worker.wake()

    def note_record(self, *, ship_now: bool = False) -> None:
        """A record was journaled. Ship at once only when a batch is filling up: at low load
        one transaction per call would cost more than the calls themselves; the interval
        timer ships the rest within `interval_s`. `ship_now` is for a record another process
        is waiting for (a run's call under a canary, whose next call may reach another
        process): shipping starts at once, and records journaled meanwhile go with the next
        pass, so a steady stream of them costs one transaction at a time, not one each."""
        self._unshipped += 1
        if ship_now or self._unshipped >= self._wake_threshold:
            self.worker.wake()

    async def stop(self, drain_timeout_s: float = 10.0) -> None:
        """Stop the loop, then try to ship what is left; what cannot be shipped stays on disk."""
        await self.worker.stop()
        self.writer.rotate()
        deadline = time.monotonic() + drain_timeout_s
        while time.monotonic() < deadline:
            try:
                if await self.ship_once() == 0:
                    break
            except Exception as exc:  # the database is unreachable: the journal keeps it
                log.warning("journal not fully shipped at shutdown (%s); the next start ships it", exc)
                break

    async def _ship_pass(self) -> None:
        """The worker's step: one batch. A failure is counted here and retried by the worker."""
        try:
            shipped = await self.ship_once()
        except Exception as exc:
            self.stats.failed_batches += 1
            self.stats.last_error = f"{type(exc).__name__}: {exc}"[:500]
            raise
        if shipped >= self.batch_rows:
            self.worker.wake()  # a full batch: more is waiting, keep draining

    # ---- one pass ------------------------------------------------------------------
    def segments(self) -> list[Path]:
        return sorted(self.directory.glob("*" + SEGMENT_SUFFIX))

    def backlog_bytes(self) -> int:
        total = 0
        for path in self.segments():
            try:
                size = path.stat().st_size
                offset_path = path.with_name(path.name + OFFSET_SUFFIX)
                shipped = int(offset_path.read_bytes().strip() or 0) if offset_path.exists() else 0
            except (OSError, ValueError):
                continue
            total += max(0, size - shipped)
        return total

    async def ship_once(self) -> int:
        """Ship up to one batch from the oldest segment that has work; return rows shipped.

        The directory is listed only every RESCAN_INTERVAL_S (or when this process rotates):
        other processes' segments appear rarely, and an idle gateway should cost nothing.
        """
        active = self.writer.active_path
        now = time.monotonic()
        if now - self._last_scan >= RESCAN_INTERVAL_S or self._scanned_active != active:
            self._foreign = [path for path in self.segments() if path != active]
            self._scanned_active, self._last_scan = active, now
            self.stats.backlog_bytes = self.backlog_bytes()
        candidates = list(self._foreign)
        if active is not None and self._own_shipped != (active, self.writer.active_size):
            candidates.append(active)
        for path in candidates:
            locked = self._lock(path)
            if locked is None:
                continue
            try:
                shipped = await self._ship_segment(locked)
            finally:
                locked.release()
            if not path.exists():
                self._foreign = [p for p in self._foreign if p != path]
            if shipped:
                return shipped
        return 0

    def _lock(self, path: Path) -> _LockedSegment | None:
        own = path == self.writer.active_path
        segment_fd = None
        if not own:
            try:
                segment_fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                return None
            try:
                fcntl.flock(segment_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # a live writer owns it; its own shipper ships it
                os.close(segment_fd)
                return None
        offset_path = path.with_name(path.name + OFFSET_SUFFIX)
        offset_fd = os.open(offset_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(offset_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(offset_fd)
            if segment_fd is not None:
                os.close(segment_fd)
            return None
        if not path.exists():  # shipped and removed by someone else meanwhile
            os.close(offset_fd)
            if segment_fd is not None:
                os.close(segment_fd)
            offset_path.unlink(missing_ok=True)
            return None
        return _LockedSegment(path, offset_fd, segment_fd)

    async def _ship_segment(self, locked: _LockedSegment) -> int:
        own = locked.segment_fd is None
        offset = _read_offset(locked.offset_fd)
        end = self.writer.active_size if own else locked.path.stat().st_size
        lines, consumed = self._read_lines(locked.path, offset, end)
        if lines:
            self._unshipped = 0
            await self.ship(lines)
            _write_offset(locked.offset_fd, offset + consumed)
            if own:
                self._own_shipped = (locked.path, offset + consumed)
            self.stats.shipped_rows += len(lines)
            self.stats.last_success_at = time.time()
            return len(lines)
        if own:
            self._own_shipped = (locked.path, offset + consumed)
        elif offset + consumed >= end:
            self._remove(locked, offset, end)
        return 0

    def _read_lines(self, path: Path, offset: int, end: int) -> tuple[list[bytes], int]:
        """Complete lines from offset, at most one batch; a torn last line is left alone."""
        if end <= offset:
            return [], 0
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read(end - offset)
        last_newline = data.rfind(b"\n")
        if last_newline < 0:
            return [], 0
        lines = data[: last_newline + 1].splitlines()
        if len(lines) > self.batch_rows:
            lines = lines[: self.batch_rows]
        consumed = sum(len(line) + 1 for line in lines)
        return [line for line in lines if line.strip()], consumed

    def _remove(self, locked: _LockedSegment, offset: int, end: int) -> None:
        with open(locked.path, "rb") as handle:
            handle.seek(offset)
            torn = handle.read()
        if torn.strip():
            log.error(
                "journal segment %s ends with an incomplete record (%d bytes) written by a "
                "process that died mid-write; it is kept as %s.torn",
                locked.path.name,
                len(torn),
                locked.path.name,
            )
            locked.path.rename(locked.path.with_name(locked.path.name + ".torn"))
        else:
            locked.path.unlink(missing_ok=True)
        locked.offset_path.unlink(missing_ok=True)
