"""The fake upstream answers what it cannot read as the real APIs do, with a 400 in the protocol's
error format, never with a crash: the gateway forwards chat, Responses and Messages bodies unread,
so whatever a client (or the fuzzer, tests/test_schemathesis.py) sends reaches the fake, and a 500
from it would read as the gateway's own server error."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

HELLO = [{"role": "user", "content": "Hello"}]
CHAT = {"model": "fake-model", "messages": HELLO}


def _text_part(text: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "text", "text": text}]}]


MALFORMED_CHAT: dict[str, Any] = {
    "an array body": [CHAT],
    "a message that is not an object": {**CHAT, "messages": ["Hello"]},
    "a text part's text a number": {**CHAT, "messages": _text_part(5)},
    "a text part's text null": {**CHAT, "messages": _text_part(None)},
    "a content part that is not an object": {**CHAT, "messages": [{"role": "user", "content": ["Hello"]}]},
    "tools an object": {**CHAT, "tools": {"type": "function"}},
    "a tool that is not an object": {**CHAT, "tools": ["get_weather"]},
    "a tool's function a number": {**CHAT, "tools": [{"type": "function", "function": 5}]},
    "a tool's function named by a list": {**CHAT, "tools": [{"type": "function", "function": {"name": ["x"]}}]},
    "a tool's function without a name": {**CHAT, "tools": [{"type": "function", "function": {}}]},
    "seed a string": {**CHAT, "seed": "7"},
    "seed a boolean": {**CHAT, "seed": True},
    "seed a fraction": {**CHAT, "seed": 1.5},
    "seed below 64 bits": {**CHAT, "seed": -(2**63) - 1},
    "seed above 64 bits": {**CHAT, "seed": 2**63},
    "seed above the declared bound": {**CHAT, "seed": 2**63 - 1},
    "stream_options a string": {**CHAT, "stream": True, "stream_options": "usage"},
    "split_done_ms a string": {**CHAT, "stream": True, "fake_stream": {"split_done_ms": "soon"}},
}


@pytest.mark.parametrize("body", MALFORMED_CHAT.values(), ids=MALFORMED_CHAT.keys())
def test_a_chat_body_the_fake_cannot_read_is_a_400_in_openais_format(fake_upstream, body):
    answer = httpx.post(fake_upstream.api_base + "/chat/completions", json=body, timeout=30)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["type"] == "invalid_request_error"


def test_what_openai_allows_is_still_answered(fake_upstream):
    url = fake_upstream.api_base + "/chat/completions"
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    called = httpx.post(url, json={**CHAT, "tools": [tool], "seed": 3}, timeout=30)
    assert called.status_code == 200, called.text
    # An integer as JSON Schema reads one, as the gateway's document declares seed.
    assert httpx.post(url, json={**CHAT, "seed": 12409.0}, timeout=30).status_code == 200
    # The declared bounds as a fuzzer writes them, shortest decimal of the double (protocol.SEED_BOUND):
    # past the bounds as exact integers, within them as doubles, so within.
    for bound in ("-9223372036854775000", "9223372036854775000", "-9.223372036854775e18"):
        written = (
            b'{"model": "fake-model", "messages": [{"role": "user", "content": "Hi"}], "seed": %s}' % bound.encode()
        )
        assert (
            httpx.post(url, content=written, headers={"content-type": "application/json"}, timeout=30).status_code
            == 200
        )
    assert called.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    # A part without text (an image), null stream options, a fractional chunk count: read, not a crash.
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]
    streamed = httpx.post(
        url,
        json={**CHAT, "messages": image, "stream": True, "stream_options": None, "fake_stream": {"chunks": 0.5}},
        timeout=30,
    )
    assert streamed.status_code == 200, streamed.text
    assert streamed.text.rstrip().endswith("data: [DONE]")


MALFORMED_RESPONSES: dict[str, Any] = {
    "not JSON": b"{",
    "an array body": [{"model": "fake-model", "input": "Hello"}],
    "tools a string": {"model": "fake-model", "input": "Hello", "tools": "get_weather"},
    "a tool that is not an object": {"model": "fake-model", "input": "Hello", "tools": [5]},
    "an input text that is an object": {
        "model": "fake-model",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": {"a": 1}}]}],
    },
    "previous_response_id a list": {"model": "fake-model", "input": "Hello", "previous_response_id": ["resp_1"]},
}


@pytest.mark.parametrize("body", MALFORMED_RESPONSES.values(), ids=MALFORMED_RESPONSES.keys())
def test_a_responses_body_the_fake_cannot_read_is_a_400_in_openais_format(fake_upstream, body):
    sent = {"content": body} if isinstance(body, bytes) else {"json": body}
    answer = httpx.post(fake_upstream.api_base + "/responses", timeout=30, **sent)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["type"] == "invalid_request_error"


MESSAGES = {"model": "fake-model", "max_tokens": 8, "messages": HELLO}
MALFORMED_MESSAGES: dict[str, Any] = {
    "a string body": "Hello",
    "a tool without a name": {**MESSAGES, "tools": [{"input_schema": {}}]},
    "a text block's text a number": {**MESSAGES, "messages": _text_part(1)},
}


@pytest.mark.parametrize("path", ["/messages", "/messages/count_tokens"])
@pytest.mark.parametrize("body", MALFORMED_MESSAGES.values(), ids=MALFORMED_MESSAGES.keys())
def test_a_messages_body_the_fake_cannot_read_is_a_400_in_anthropics_format(fake_upstream, path, body):
    answer = httpx.post(fake_upstream.api_base + path, json=body, headers={"x-api-key": "sk-any"}, timeout=30)
    assert answer.status_code == 400, answer.text
    assert answer.json()["type"] == "error" and answer.json()["error"]["type"] == "invalid_request_error"
