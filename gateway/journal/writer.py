"""The append-only local journal that every completed call is written to first.

Recording must never wait on PostgreSQL, and nothing completed may be lost to a database
outage, a SIGTERM or a SIGKILL. So a call is appended (one JSON line, one write(2)) to a
segment file before its last byte reaches the client; the shipper moves segments into
PostgreSQL later. A process holds an exclusive flock on the segment it writes, which tells
other processes' shippers to leave that segment to its owner; a segment whose lock is free
(rotated, or its writer died) may be shipped by anyone.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import time
from pathlib import Path
from typing import Any

import orjson

SEGMENT_SUFFIX = ".jsonl"


def segment_name() -> str:
    """Names sort in creation order, so the backlog drains in the order calls completed."""
    return f"{time.time_ns():020d}-{os.getpid()}-{secrets.token_hex(4)}{SEGMENT_SUFFIX}"


class JournalWriter:
    """Appends records to this process's current segment and rotates it by size and age."""

    def __init__(self, directory: Path, *, max_bytes: int, max_age_s: float, fsync: bool = False) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.fsync = fsync
        self._fd: int | None = None
        self.active_path: Path | None = None
        self.active_size = 0
        self._opened_at = 0.0
        self.records_written = 0

    def open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._open_segment()

    def _open_segment(self) -> None:
        path = self.directory / segment_name()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._fd, self.active_path, self.active_size = fd, path, 0
        self._opened_at = time.monotonic()

    def append(self, record: dict[str, Any]) -> None:
        """Write one record durably enough to survive the process being killed."""
        self.append_line(orjson.dumps(record) + b"\n")

    def append_line(self, line: bytes) -> None:
        if self._fd is None:
            raise RuntimeError("journal is closed")
        view = memoryview(line)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        if self.fsync:
            os.fsync(self._fd)
        self.active_size += len(line)
        self.records_written += 1
        if self.active_size >= self.max_bytes or time.monotonic() - self._opened_at >= self.max_age_s:
            self.rotate()

    def rotate(self) -> None:
        """Seal the current segment (releasing its lock) and start a new one."""
        if self._fd is None:
            return
        if self.active_size == 0 and time.monotonic() - self._opened_at < self.max_age_s:
            return
        old_fd, old_path, old_size = self._fd, self.active_path, self.active_size
        self._open_segment()
        os.close(old_fd)
        if old_size == 0 and old_path is not None:
            old_path.unlink(missing_ok=True)

    def close(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
            if self.active_path is not None and self.active_size == 0:
                self.active_path.unlink(missing_ok=True)
