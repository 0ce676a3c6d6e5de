"""The recorder is a room of its own (gateway/recorder.py): built from the settings and the store,
without the gateway's app, it redacts a call's record, journals it and ships it into PostgreSQL."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

from apprentice.settings import Settings
from apprentice.store.engine import make_async_engine
from gateway.recorder import Recorder


def test_the_recorder_without_the_app_stores_a_redacted_call_and_wakes_the_linker(database_url, db, tmp_path):
    settings = Settings(data_dir=tmp_path)  # redaction is on by default (docs/privacy.md)
    call_id = uuid.uuid4()
    record = {
        "id": str(call_id),
        "trajectory_id": str(uuid.uuid4()),
        "tenant": "local",
        "model": "fake-model",
        "created_at": time.time(),
        "status_code": 200,
        "request": {"messages": [{"role": "user", "content": "mail me at ada@example.com"}]},
        "response": {"choices": []},
    }
    shipped_batches: list[int] = []

    async def record_and_stop() -> None:
        engine = make_async_engine(database_url)
        recorder = Recorder(settings, engine, on_shipped=lambda: shipped_batches.append(1))
        try:
            await recorder.start()
            recorder.record(record)
            await recorder.stop()  # the shipper drains what is journaled before it stops
        finally:
            await engine.dispose()

    asyncio.run(record_and_stop())

    row = db.execute("SELECT request->'messages'->0->>'content' FROM calls WHERE id = %s", (call_id,)).fetchone()
    assert row is not None, "the call was shipped into PostgreSQL"
    assert "ada@example.com" not in row[0] and row[0].startswith("mail me at <"), row[0]
    journal = [p.read_bytes() for p in Path(settings.journal_dir).rglob("*") if p.is_file()]
    assert journal and not any(b"ada@example.com" in data for data in journal), "the journal holds no clear text"
    assert shipped_batches, "the reward linker is woken after a stored batch"
