"""One record PostgreSQL cannot store must not hold back the calls behind it.

jsonb cannot hold a NUL character, and a client may send one (or a model may write one). Such a
record failed its whole batch, which the shipper retried forever, so no later call was stored.
Now NUL is stored as U+FFFD, and a record refused for any other data reason is set aside under
the journal's `rejected/` while the rest of its batch is stored.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import openai
import orjson

from apprentice.store.engine import make_async_engine
from gateway.journal.rejected import rejected_path, set_aside
from gateway.store.calls import insert_call_lines, jsonb_safe
from tests.conftest import count_rows, wait_for


def test_nul_escapes_become_replacement_characters_and_escaped_backslashes_stay() -> None:
    nul = orjson.dumps({"content": "a\x00b"})
    literal = orjson.dumps({"content": "a\\u0000b"})  # a backslash, then the text u0000
    both = orjson.dumps({"content": "\\\x00"})  # a backslash, then a NUL
    assert orjson.loads(jsonb_safe(nul)) == {"content": "a\ufffdb"}
    assert jsonb_safe(literal) == literal
    assert orjson.loads(jsonb_safe(both)) == {"content": "\\\ufffd"}


def test_a_nul_in_a_prompt_is_stored_and_does_not_block_later_calls(start_gateway, db) -> None:
    gateway = start_gateway()
    client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
    client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "nul \x00 here"}])
    client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "text \\u0000 here"}])
    client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "after them"}])
    wait_for(lambda: count_rows(db, "SELECT count(*) FROM calls") == 3, timeout=30, message="all three calls stored")
    contents = {row[0] for row in db.execute("SELECT request->'messages'->0->>'content' FROM calls").fetchall()}
    assert contents == {"nul \ufffd here", "text \\u0000 here", "after them"}
    assert not rejected_path(gateway_journal(gateway)).exists()


def gateway_journal(gateway):
    return Path(gateway.config["data_dir"]) / "journal"


def _record(call_id: uuid.UUID, **fields: object) -> bytes:
    record: dict[str, object] = {
        "id": str(call_id),
        "trajectory_id": str(uuid.uuid4()),
        "tenant": "local",
        "model": "fake-model",
        "created_at": 1_780_000_000.0,
        "status_code": 200,
        "request": {"messages": [{"role": "user", "content": "hi"}]},
        "response": {"choices": []},
    }
    record.update(fields)
    return orjson.dumps(record)


def test_a_record_refused_as_data_is_returned_and_the_rest_of_its_batch_stored(database_url, db) -> None:
    good = [uuid.uuid4(), uuid.uuid4()]
    bad = uuid.uuid4()
    lines = [_record(good[0]), _record(bad, created_at="not a time"), _record(good[1])]

    async def ship():
        engine = make_async_engine(database_url)
        try:
            return await insert_call_lines(engine, lines)
        finally:
            await engine.dispose()

    shipped = asyncio.run(ship())
    assert shipped.stored == 2
    assert [r.line for r in shipped.rejected] == [lines[1]]
    assert "DataError" in shipped.rejected[0].reason or "InvalidTextRepresentation" in shipped.rejected[0].reason
    stored = {row[0] for row in db.execute("SELECT id FROM calls").fetchall()}
    assert stored == set(good)
    assert count_rows(db, "SELECT count(*) FROM trajectories") == 2


def test_set_aside_keeps_the_record_and_the_reason(tmp_path) -> None:
    line = _record(uuid.uuid4(), created_at="not a time")
    path = set_aside(tmp_path, line, "InvalidTextRepresentation: bad")
    set_aside(tmp_path, b"not json at all", "DataError: worse")
    entries = [orjson.loads(raw) for raw in path.read_bytes().splitlines()]
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    assert entries[0] == {"reason": "InvalidTextRepresentation: bad", "record": orjson.loads(line)}
    assert entries[1] == {"reason": "DataError: worse", "raw": "not json at all"}
