"""A point in time as the API takes it: unix seconds or an RFC 3339 date-time, UTC when no offset.

One rule for every timestamp a client sends, in a query (`since`, `until`) or a body (a
reward's `timestamp`, an evaluation set's trajectory query): `parse_timestamp`. Why not
pydantic's `datetime`: it takes more than the OpenAPI document can say (a number over 2e10 it
reads as milliseconds, `+0530` offsets, a bare JSON number where
the document said `format: date-time`), so a fuzzer sending what the document forbids found it
accepted (tests/test_schemathesis.py, ST201), and a client could not know which of two readings
of a number it got. Here what is accepted is what is documented:

- a string of `ACCEPTED` (a date, optionally `T` or a space and a time, seconds, any number of
  fraction digits read to the microsecond, and a `Z` or `+HH:MM` offset; or unix seconds written
  out, as `str(time.time())` writes them), naming an instant that exists;
- in a JSON body, also a number of unix seconds (not a boolean);
- between `EARLIEST` and `LATEST`, so that the instant and any offset of it fit a `datetime`
  and PostgreSQL's `timestamptz` read back.

The document shows strings as `TIMESTAMP_PATTERN`, the same shape with years 1900-2099 and days
1-28, so that every string a fuzzer generates from it names a date that exists; a client's
2026-01-31 is outside the pattern and still accepted, as no generator of non-matching strings
writes a valid date by chance.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Annotated, Any

from pydantic import BeforeValidator, WithJsonSchema

_TIME = r"([T ]([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9](\.[0-9]+)?)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])?)?"
_UNIX = r"-?[0-9]{1,10}(\.[0-9]+)?"

TIMESTAMP_PATTERN = rf"^((19|20)[0-9]{{2}}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8]){_TIME}|{_UNIX})$"
ACCEPTED = re.compile(rf"([0-9]{{4}}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01]){_TIME}|{_UNIX})")

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
EARLIEST = datetime(1, 1, 2, tzinfo=timezone.utc)
LATEST = datetime(9999, 12, 30, 23, 59, 59, tzinfo=timezone.utc)
EARLIEST_UNIX = int((EARLIEST - _EPOCH).total_seconds())
LATEST_UNIX = int((LATEST - _EPOCH).total_seconds())

EXPECTED = "unix seconds or an RFC 3339 date-time such as 2026-11-01T00:00:00Z"


def parse_timestamp(value: Any) -> datetime:
    """The instant `value` names (aware, UTC when it names no offset), or ValueError saying what is expected."""
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"must be {EXPECTED}")
    if isinstance(value, str):
        if not ACCEPTED.fullmatch(value):
            raise ValueError(f"must be {EXPECTED}, not {value[:40]!r}")
        if re.fullmatch(_UNIX, value):
            return _from_unix(float(value))
        try:
            stamp = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"{value[:40]!r} names no date that exists") from None
        stamp = stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=timezone.utc)
        if not EARLIEST <= stamp <= LATEST:
            raise ValueError(f"must be between {EARLIEST.isoformat()} and {LATEST.isoformat()}")
        return stamp
    return _from_unix(value)


def _from_unix(seconds: int | float) -> datetime:
    """Bounds are compared before any conversion (a JSON integer of 400 digits overflows a float);
    NaN compares false and infinities fall outside, so the comparison refuses them too."""
    if not EARLIEST_UNIX <= seconds <= LATEST_UNIX:
        raise ValueError(f"unix seconds must be between {EARLIEST_UNIX} and {LATEST_UNIX}")
    return _EPOCH + timedelta(seconds=seconds)


# A timestamp field of a JSON body.
Timestamp = Annotated[
    datetime,
    BeforeValidator(parse_timestamp),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": TIMESTAMP_PATTERN},
                {"type": "number", "minimum": EARLIEST_UNIX, "maximum": LATEST_UNIX},
            ]
        }
    ),
]

# A timestamp query parameter (always a string); its document is `timestamp_schema`'s.
QueryTimestamp = Annotated[datetime, BeforeValidator(parse_timestamp)]


def timestamp_schema(schema: dict[str, Any]) -> None:
    """`json_schema_extra` of a `QueryTimestamp` parameter: a string of `TIMESTAMP_PATTERN`, not
    pydantic's `date-time` format (which leaves out the unix seconds the route also takes)."""
    description = schema.get("description")
    schema.clear()
    schema.update({"type": "string", "pattern": TIMESTAMP_PATTERN})
    if description:
        schema["description"] = description
