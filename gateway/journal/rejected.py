"""Journal lines PostgreSQL refused as data, set aside beside the journal instead of lost.

A record the database can never store (a value no column can hold) would otherwise be retried
forever and hold back every call written after it. The shipper stores the rest of its batch and
appends each refused line, unchanged, with the database's reason, to `rejected/calls.jsonl`
under the journal directory: an operator can read, fix and replay it
(`{"reason": ..., "record": <the journal line>}` per line). Only the call's id is logged: the
record holds prompts and answers.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import orjson

log = logging.getLogger(__name__)

REJECTED_DIR = "rejected"
REJECTED_FILE = "calls.jsonl"


def rejected_path(journal_dir: Path) -> Path:
    return journal_dir / REJECTED_DIR / REJECTED_FILE


def set_aside(journal_dir: Path, line: bytes, reason: str) -> Path:
    """Append one refused journal line to the rejected file, durably, and log its call id."""
    path = rejected_path(journal_dir)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # prompts and answers: like the journal
    try:
        call_id = orjson.loads(line).get("id")
    except orjson.JSONDecodeError:
        call_id = None
    entry = b'{"reason":' + orjson.dumps(reason) + b',"record":' + line.rstrip(b"\n") + b"}\n"
    if call_id is None:  # not even JSON: keep the bytes as a string so the file stays JSON lines
        entry = orjson.dumps({"reason": reason, "raw": line.decode("utf-8", "replace")}) + b"\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        view = memoryview(entry)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    # The reason may quote the refused value, so it goes to the file, not to the log.
    log.error("journal: call %s refused by PostgreSQL; set aside with the reason in %s", call_id, path)
    return path
