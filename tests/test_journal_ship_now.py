"""A record another process waits for is shipped at once; the others wait for the interval.

While a canary serves a policy, a run's next call that reaches another process looks its run up
in the store (gateway/trajectories/parents.py), so the run's call is shipped as soon as it is
journaled instead of within `ship_interval_s`. The shipper's rule, with its real writer and
worker and a ship function that notes when each batch arrives.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from gateway.journal.shipper import JournalShipper
from gateway.journal.writer import JournalWriter


async def test_ship_now_ships_at_once_and_an_ordinary_record_waits_for_the_interval(tmp_path: Path) -> None:
    writer = JournalWriter(tmp_path / "journal", max_bytes=1 << 20, max_age_s=3600)
    writer.open()
    arrived: list[tuple[float, int]] = []

    async def ship(lines: list[bytes]) -> int:
        arrived.append((time.monotonic(), len(lines)))
        return len(lines)

    shipper = JournalShipper(writer, ship, batch_rows=1000, interval_s=30.0)
    shipper.start()
    try:
        await asyncio.sleep(0.2)  # the worker's first pass (nothing to ship yet) is behind it
        arrived.clear()
        writer.append({"id": "ordinary"})
        shipper.note_record()
        await asyncio.sleep(1.0)
        assert arrived == [], "an ordinary record waits for the interval (or a filling batch)"

        journaled = time.monotonic()
        writer.append({"id": "awaited"})
        shipper.note_record(ship_now=True)
        for _ in range(100):
            if arrived:
                break
            await asyncio.sleep(0.01)
        assert arrived, "a record another process waits for is shipped at once"
        at, rows = arrived[0]
        assert rows == 2, "the pass takes every line journaled so far"
        assert at - journaled < 0.5
    finally:
        await shipper.worker.stop()
        writer.close()
