"""Streams are relayed event by event: any SSE line ending, `[DONE]` held back even when split."""

from __future__ import annotations

import time

import httpx
import orjson
import pytest

from gateway.endpoints.chat_completions.sse import EventRelay
from tests.conftest import wait_for

EVENTS = [b'data: {"a": 1}', b": a comment", b'event: x\ndata: {"b": 2}', b"data: [DONE]"]


def relay_all(relay: EventRelay, stream: bytes, cuts: list[int]) -> list[bytes]:
    """Feed `stream` cut at `cuts`; return what each feed released, then finish()."""
    pieces, start = [], 0
    for cut in [*cuts, len(stream)]:
        pieces.append(relay.feed(stream[start:cut]))
        start = cut
    return [*pieces, relay.finish()]


@pytest.mark.parametrize("ending", [b"\n\n", b"\r\n\r\n", b"\r\r"])
def test_every_cut_of_a_stream_relays_the_same_bytes_and_holds_done_back(ending: bytes):
    stream = b"".join(event + ending for event in EVENTS)
    done_at = stream.index(b"data: [DONE]")
    for cut in range(1, len(stream)):
        out = relay_all(EventRelay(), stream, [cut])
        assert b"".join(out) == stream, f"cut at {cut}"
        assert b"".join(out[:-1]) == stream[:done_at], f"cut at {cut}: [DONE] (or part of it) was released early"
        assert out[-1] == stream[done_at:]


def test_events_are_released_whole_and_rewritten_with_their_terminator():
    stream = b'data: {"a": 1}\r\n\r\ndata: {"a": 2}\r\n\r\ndata: [DONE]\r\n\r\n'
    relay = EventRelay(lambda event: event.replace(b"1", b"9").replace(b"2", b"8"))
    assert relay.feed(stream[:10]) == b""
    assert relay.feed(stream[10:25]) == b'data: {"a": 9}\r\n\r\n'
    assert relay.feed(stream[25:]) == b'data: {"a": 8}\r\n\r\n'
    assert relay.finish() == b"data: [DONE]\r\n\r\n"


def test_an_unterminated_last_event_is_not_lost():
    relay = EventRelay()
    assert relay.feed(b'data: {"a": 1}\n\ndata: {"b"') == b'data: {"a": 1}\n\n'
    assert relay.finish() == b'data: {"b"'


def timed_stream(url: str, body: dict) -> list[tuple[float, bytes]]:
    """Raw pieces of a streamed answer with the time each arrived."""
    pieces = []
    with httpx.stream("POST", url, json=body, timeout=30) as response:
        assert response.status_code == 200
        for piece in response.iter_raw():
            pieces.append((time.monotonic(), piece))
    return pieces


def test_a_split_done_reaches_the_client_only_after_the_call_is_journaled(start_gateway, db):
    gateway = start_gateway()
    pieces = timed_stream(
        f"{gateway.base_url}/chat/completions",
        {
            "model": "fake-model",
            "stream": True,
            "messages": [{"role": "user", "content": "split"}],
            "fake_stream": {"split_done_ms": 600, "chunks": 3},
        },
    )
    received = b"".join(piece for _, piece in pieces)
    assert received.endswith(b"data: [DONE]\n\n")
    first_done_byte = next(i for i, (_, piece) in enumerate(pieces) if b"[D" in piece or piece.startswith(b"NE]"))
    assert b"data: [DONE]" in pieces[first_done_byte][1], "part of [DONE] went out before the upstream finished it"
    assert first_done_byte == len(pieces) - 1
    assert pieces[-1][0] - pieces[0][0] >= 0.5, "the held-back end arrived before the upstream sent it"
    assert wait_for(lambda: db.execute("SELECT count(*) FROM calls WHERE stream").fetchone()[0] == 1)


def test_a_crlf_policy_stream_is_stripped_and_relayed_as_it_arrives(start_gateway, fake_upstream, db):
    policy = {"name": "crlf-agent", "base_model": "fake-base", "endpoints": [fake_upstream.api_base]}
    gateway = start_gateway(policies=[policy])
    pieces = timed_stream(
        f"{gateway.base_url}/chat/completions",
        {
            "model": "crlf-agent",
            "stream": True,
            "messages": [{"role": "user", "content": "crlf"}],
            "fake_stream": {"line_ending": "crlf", "chunk_delay_ms": 150, "chunks": 4},
        },
    )
    received = b"".join(piece for _, piece in pieces)
    events = [event for event in received.split(b"\r\n\r\n") if event.startswith(b"data: {")]
    assert len(events) >= 5
    for event in events:
        chunk = orjson.loads(event[6:])
        assert all("token_ids" not in choice and choice.get("logprobs") is None for choice in chunk["choices"])
    first_content = next(t for t, piece in pieces if b'"content"' in piece)
    assert pieces[-1][0] - first_content >= 0.4, "the stream was buffered whole instead of relayed event by event"
    row = wait_for(lambda: db.execute("SELECT response FROM calls WHERE policy = 'crlf-agent'").fetchone())
    assert row[0]["choices"][0]["message"]["content"].startswith("crlf")
    assert row[0]["choices"][0]["token_ids"], "the recorded answer keeps the token ids the client did not see"
