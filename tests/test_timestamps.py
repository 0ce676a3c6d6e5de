"""The API's one timestamp rule (gateway/http/timestamps.py) accepts what the OpenAPI document says
it does, and refuses what the document forbids (the fuzzer's ST201 on an evaluation set's query).

Property tests over the rule itself (hypothesis), then the same values through a real gateway:
a reward's `timestamp`, an evaluation set's trajectory query and the trajectory listing's `since`.
"""

from __future__ import annotations

import math
import time
from datetime import datetime, timezone

import httpx
import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from gateway.http.timestamps import (
    ACCEPTED,
    EARLIEST_UNIX,
    LATEST_UNIX,
    TIMESTAMP_PATTERN,
    Timestamp,
    parse_timestamp,
)

BODY = TypeAdapter(Timestamp)
DOCUMENTED = jsonschema.Draft202012Validator(BODY.json_schema())


def _accepted(value: object) -> bool:
    try:
        BODY.validate_python(value)
    except ValidationError:
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(st.from_regex(TIMESTAMP_PATTERN, fullmatch=True))
def test_every_string_the_document_allows_is_accepted_as_an_aware_instant(text):
    stamp = parse_timestamp(text)
    assert stamp.tzinfo is not None


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.integers(EARLIEST_UNIX, LATEST_UNIX), st.floats(EARLIEST_UNIX, LATEST_UNIX)))
def test_every_number_the_document_allows_is_unix_seconds(seconds):
    assert DOCUMENTED.is_valid(seconds)
    assert BODY.validate_python(seconds).timestamp() == pytest.approx(seconds, abs=1e-3)


@settings(max_examples=1500, deadline=None)
@given(
    st.one_of(
        st.text(max_size=40),
        st.text(alphabet="0123456789-:+.TZ tz", max_size=32),
        st.integers(),
        st.floats(allow_nan=True, allow_infinity=True),
        st.booleans(),
        st.none(),
        st.lists(st.integers(), max_size=2),
    )
)
def test_nothing_outside_the_document_is_accepted(value):
    """Accepted means documented, but for dates the pattern leaves out on purpose (years outside
    1900-2099, days 29-31), which still have the documented shape."""
    if not _accepted(value):
        return
    if DOCUMENTED.is_valid(value):
        return
    assert isinstance(value, str) and ACCEPTED.fullmatch(value), value


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, datetime(1970, 1, 1, tzinfo=timezone.utc)),
        ("1.5", datetime(1970, 1, 1, 0, 0, 1, 500000, tzinfo=timezone.utc)),
        # as str(time.time()) writes it: seven fraction digits, read to the microsecond
        ("1796000000.1234567", datetime(2026, 11, 30, 0, 53, 20, 123457, tzinfo=timezone.utc)),
        ("2026-11-01T10:00:00.1234567Z", datetime(2026, 11, 1, 10, 0, 0, 123456, tzinfo=timezone.utc)),
        ("2026-01-31", datetime(2026, 1, 31, tzinfo=timezone.utc)),
        ("2026-11-01 10:00", datetime(2026, 11, 1, 10, tzinfo=timezone.utc)),
        ("2026-11-01T10:00:00+02:00", datetime(2026, 11, 1, 8, tzinfo=timezone.utc)),
        # read as seconds, never as milliseconds (pydantic's datetime reads this as 1970)
        (20_000_000_000, datetime(2603, 10, 11, 11, 33, 20, tzinfo=timezone.utc)),
    ],
)
def test_what_a_value_means(value, expected):
    assert parse_timestamp(value) == expected


@pytest.mark.parametrize(
    "value", [True, "now", "2026-02-30", "2026-11-01T10:00:00+0200", "1e3", math.inf, 1e300, 10**400, "12345678901"]
)
def test_refused(value):
    assert not _accepted(value)


ADMIN = {"Authorization": "Bearer sk-admin-timestamps"}


def test_timestamps_through_a_gateway(start_gateway):
    policy = {"name": "agent", "base_model": "base-model", "endpoints": ["http://127.0.0.1:9/v1"]}
    gateway = start_gateway(policies=[policy], auth={"mode": "keys", "admin_key": "sk-admin-timestamps"})
    with httpx.Client(headers=ADMIN, timeout=30) as client:
        sets = f"{gateway.url}/v1/admin/policies/agent/eval-sets"
        assert client.post(sets, json={"name": "s", "scoring": {"method": "judge"}}).status_code == 201
        for since in [0, "2026-01-31T00:00:00Z", time.time() + 3600]:
            added = client.post(f"{sets}/s/items", json={"query": {"since": since}})
            assert added.status_code == 201, added.text
        for since in [True, "2026-02-30", "yesterday"]:
            refused = client.post(f"{sets}/s/items", json={"query": {"since": since}})
            assert refused.status_code == 400, refused.text
            assert refused.json()["error"]["param"] == "query.since", refused.text

        listing = client.get(f"{gateway.url}/v1/trajectories", params={"since": "2026-02-30"})
        assert listing.status_code == 400 and listing.json()["error"]["param"] == "query.since", listing.text
        assert client.get(f"{gateway.url}/v1/trajectories", params={"since": "1700000000"}).status_code == 200

        reward = {"client_trajectory_id": "run-1", "reward": 1.0}
        for stamp in [True, "2026-11-01T10:00:00+0200", 1e300, 10**400]:
            refused = client.post(f"{gateway.url}/v1/rewards", json={**reward, "timestamp": stamp})
            assert refused.status_code == 400 and refused.json()["error"]["param"] == "timestamp", refused.text
        naive = client.post(f"{gateway.url}/v1/rewards", json={**reward, "timestamp": "2026-11-01T10:00:00"})
        assert naive.status_code in (200, 202), naive.text
        observed = datetime.fromisoformat(naive.json()["observed_at"])
        assert observed == datetime(2026, 11, 1, 10, tzinfo=timezone.utc)
