"""Anthropic Messages <-> chat completions: requests, answers, streams and errors.

Pure unit tests. What the gateway sends back is checked with the official `anthropic` SDK:
each event and message against its pydantic types (no field the SDK does not know), and whole
streams through the SDK's own HTTP client, SSE decoder and stream accumulator, over an
in-memory transport.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2
import orjson
import pytest
from anthropic._models import BaseModel as SDKModel
from anthropic.types import (
    Message,
    RawContentBlockDeltaEvent,
    RawContentBlockStartEvent,
    RawContentBlockStopEvent,
    RawMessageDeltaEvent,
    RawMessageStartEvent,
    RawMessageStopEvent,
)
from anthropic.types.shared import ErrorResponse

from gateway.endpoints.chat_completions.assembly import assemble_completion
from gateway.endpoints.messages.errors import MessagesError, error_body, from_openai_error
from gateway.endpoints.messages.stream import MessagesStream
from gateway.endpoints.messages.translate import (
    count_tokens_text,
    estimate_tokens,
    to_chat_request,
    to_message,
)

MESSAGE_ID = "msg_01test"
MODEL = "my-policy"

# --- helpers: the SDK as the judge ----------------------------------------------------------

EVENT_TYPES: dict[str, type[SDKModel]] = {
    "message_start": RawMessageStartEvent,
    "content_block_start": RawContentBlockStartEvent,
    "content_block_delta": RawContentBlockDeltaEvent,
    "content_block_stop": RawContentBlockStopEvent,
    "message_delta": RawMessageDeltaEvent,
    "message_stop": RawMessageStopEvent,
    "error": ErrorResponse,
}


def assert_known_fields(value: Any, where: str = "") -> None:
    """The SDK's models accept unknown fields silently; we must send none."""
    if isinstance(value, SDKModel):
        assert not value.model_extra, f"{where}: fields the SDK does not know: {sorted(value.model_extra or {})}"
        for name in type(value).model_fields:
            assert_known_fields(getattr(value, name), f"{where}.{name}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            assert_known_fields(item, f"{where}.{i}")


def validated_message(message: dict[str, Any]) -> Message:
    parsed = Message.model_validate(message)
    assert_known_fields(parsed, "message")
    return parsed


def parse_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """`event: <type>\\ndata: <json>\\n\\n`, each checked against the SDK's type for it."""
    assert raw.endswith(b"\n\n")
    events = []
    for block in raw[:-2].split(b"\n\n"):
        event_line, data_line = block.split(b"\n")
        assert event_line.startswith(b"event: ") and data_line.startswith(b"data: "), block
        name, data = event_line[7:].decode(), orjson.loads(data_line[6:])
        assert data["type"] == name
        if name in EVENT_TYPES:
            assert_known_fields(EVENT_TYPES[name].model_validate(data), name)
        else:
            assert name == "ping"
        events.append((name, data))
    return events


def sdk_client(
    body: bytes, *, status: int = 200, stream: bool = True, sent: list[Any] | None = None
) -> anthropic.Anthropic:
    """An Anthropic client whose HTTP transport answers `body` (cut in 7-byte reads when streamed,
    so the SDK's SSE decoder sees events split across reads)."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        if sent is not None:
            sent.append(json.loads(request.content))
        if not stream or status != 200:
            return httpx2.Response(status, content=body, headers={"content-type": "application/json"})
        pieces: Iterator[bytes] = (body[i : i + 7] for i in range(0, len(body), 7))
        return httpx2.Response(status, content=pieces, headers={"content-type": "text/event-stream"})

    return anthropic.Anthropic(
        api_key="test",
        base_url="http://gateway.test",
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
        max_retries=0,
        _strict_response_validation=True,
    )


REQUEST: dict[str, Any] = {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}


# --- helpers: chat completion chunks --------------------------------------------------------


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **choice: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "upstream",
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish, "logprobs": None, **choice}],
    }


def usage_chunk(prompt: int, completion: int, cached: int | None = None) -> dict[str, Any]:
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "upstream",
        "choices": [],
        "usage": usage,
    }


def tool_chunk(index: int, *, id: str | None = None, name: str | None = None, arguments: str = "") -> dict[str, Any]:
    call: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if id is not None:
        call.update(id=id, type="function")
        call["function"]["name"] = name
    return chunk({"tool_calls": [call]})


def run_stream(chunks: list[dict[str, Any]], error: dict[str, Any] | None = None) -> tuple[bytes, dict[str, Any]]:
    """The bytes MessagesStream writes for `chunks`, and the chat completion they assemble to."""
    stream = MessagesStream(message_id=MESSAGE_ID, model=MODEL)
    completion = assemble_completion(chunks)
    out = stream.start() + b"".join(stream.feed(c) for c in chunks) + stream.finish(completion, error)
    return out, completion


def streamed_through_sdk(raw: bytes) -> tuple[list[str], Message, str]:
    """The stream read by both of the SDK's ways: `create(stream=True)`'s events, and the
    `messages.stream()` helper's accumulated final message and text."""
    with sdk_client(raw).messages.create(**REQUEST, stream=True) as events:
        types = [event.type for event in events]
    with sdk_client(raw).messages.stream(**REQUEST) as helper:
        final = helper.get_final_message()
        text = helper.get_final_text() if any(b.type == "text" for b in final.content) else ""
    return types, final, text


def as_message(parsed: SDKModel) -> dict[str, Any]:
    """A message as plain data (the helper's ParsedTextBlock adds `parsed_output: None`)."""
    data = parsed.model_dump(mode="json", exclude_none=True)
    for block in data["content"]:
        block.pop("parsed_output", None)
    return data


def assert_stream_matches(chunks: list[dict[str, Any]]) -> tuple[list[tuple[str, dict[str, Any]]], Message]:
    """Every event valid, and the SDK's accumulated message == to_message(assembled completion)."""
    raw, completion = run_stream(chunks)
    events = parse_events(raw)
    types, final, _ = streamed_through_sdk(raw)
    assert types == [name for name, _ in events]
    expected = validated_message(to_message(completion, message_id=MESSAGE_ID, model=MODEL))
    assert as_message(final) == as_message(expected)
    return events, final


# --- requests -------------------------------------------------------------------------------


def test_a_plain_request_maps_every_parameter():
    chat = to_chat_request(
        {
            "model": MODEL,
            "max_tokens": 256,
            "system": "You are terse.",
            "messages": [{"role": "user", "content": "Hello"}],
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 40,
            "stop_sequences": ["END", "\n\nHuman:"],
            "stream": True,
            "metadata": {"user_id": "user-7"},
            "thinking": {"type": "enabled", "budget_tokens": 1024},  # ignored: see the module docstring
            "service_tier": "auto",
        }
    )
    assert chat == {
        "model": MODEL,
        "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello"}],
        "max_tokens": 256,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "stop": ["END", "\n\nHuman:"],
        "stream": True,
        "stream_options": {"include_usage": True},
        "user": "user-7",
    }


def test_system_as_text_blocks_becomes_one_leading_system_message():
    chat = to_chat_request(
        {
            **REQUEST,
            "system": [
                {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "Be brief."},
            ],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
                {"role": "user", "content": [{"type": "text", "text": "c"}]},
            ],
        }
    )
    assert chat["messages"] == [
        {"role": "system", "content": "You are Claude Code.\nBe brief."},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "c"},
    ]
    assert "stream" not in chat and "tools" not in chat


def test_a_tool_use_run_becomes_tool_calls_and_tool_messages_in_chat_order():
    chat = to_chat_request(
        {
            **REQUEST,
            "messages": [
                {"role": "user", "content": "What is the weather in Paris and Oslo?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "two lookups", "signature": "sig"},
                        {"type": "redacted_thinking", "data": "opaque"},
                        {"type": "text", "text": "Looking both up."},
                        {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
                        {"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {"city": "Oslo", "é": [1]}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Also, hurry."},  # before the results: still after them in chat
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"},
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_2",
                            "is_error": True,
                            "content": [{"type": "text", "text": "timeout"}, {"type": "text", "text": "retry later"}],
                        },
                    ],
                },
            ],
        }
    )
    assert chat["messages"][1:] == [
        {
            "role": "assistant",
            "content": "Looking both up.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "toolu_2",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Oslo", "é": [1]}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: timeout\nretry later"},
        {"role": "user", "content": "Also, hurry."},
    ]


def test_tool_results_alone_make_no_empty_user_message_and_tool_only_turns_have_null_content():
    chat = to_chat_request(
        {
            **REQUEST,
            "messages": [
                {"role": "user", "content": "run it"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "run", "input": {}}]},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t1"},
                        {"type": "tool_result", "tool_use_id": "t1", "is_error": True, "content": []},
                    ],
                },
            ],
        }
    )
    assert chat["messages"][1:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "run", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "t1", "content": ""},
        {"role": "tool", "tool_call_id": "t1", "content": "Error"},
    ]


def test_images_become_image_url_parts_and_tool_result_images_follow_the_tool_messages():
    png = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
    chat = to_chat_request(
        {
            **REQUEST,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": png},
                        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
                        {"type": "text", "text": "Compare."},
                    ],
                },
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read", "input": {}}]},
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "text", "text": "the file:"}, {"type": "image", "source": png}],
                        }
                    ],
                },
            ],
        }
    )
    data_url = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    assert chat["messages"][0] == {
        "role": "user",
        "content": [
            data_url,
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
            {"type": "text", "text": "Compare."},
        ],
    }
    assert chat["messages"][2:] == [
        {"role": "tool", "tool_call_id": "t1", "content": "the file:"},
        {"role": "user", "content": [data_url]},
    ]


WEATHER_TOOL = {
    "name": "weather",
    "description": "Current weather",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.mark.parametrize(
    ("tool_choice", "expected", "parallel"),
    [
        ({"type": "auto"}, "auto", None),
        ({"type": "any"}, "required", None),
        ({"type": "none"}, "none", None),
        ({"type": "tool", "name": "weather"}, {"type": "function", "function": {"name": "weather"}}, None),
        ({"type": "auto", "disable_parallel_tool_use": True}, "auto", False),
        ({"type": "any", "disable_parallel_tool_use": False}, "required", None),
        (
            {"type": "tool", "name": "weather", "disable_parallel_tool_use": True},
            {"type": "function", "function": {"name": "weather"}},
            False,
        ),
    ],
)
def test_tool_choice_variants(tool_choice: dict[str, Any], expected: Any, parallel: bool | None):
    chat = to_chat_request({**REQUEST, "tools": [WEATHER_TOOL], "tool_choice": tool_choice})
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "Current weather",
                "parameters": WEATHER_TOOL["input_schema"],
            },
        }
    ]
    assert chat["tool_choice"] == expected
    assert chat.get("parallel_tool_calls") is parallel


def test_tool_choice_naming_an_unknown_tool_or_type_is_refused():
    with pytest.raises(MessagesError, match=r"^tool_choice.name: tool 'nope'"):
        to_chat_request({**REQUEST, "tools": [WEATHER_TOOL], "tool_choice": {"type": "tool", "name": "nope"}})
    with pytest.raises(MessagesError, match=r"^tool_choice.type: "):
        to_chat_request({**REQUEST, "tools": [WEATHER_TOOL], "tool_choice": {"type": "sometimes"}})


def test_structured_output_becomes_response_format():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    chat = to_chat_request({**REQUEST, "output_config": {"format": {"type": "json_schema", "schema": schema}}})
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}


def test_what_the_sdk_sends_for_a_tool_run_translates():
    """The request body exactly as the official client writes it (not as we imagine it)."""
    sent: list[Any] = []
    answer = to_message(
        {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]},
        message_id=MESSAGE_ID,
        model=MODEL,
    )
    sdk_client(orjson.dumps(answer), stream=False, sent=sent).messages.create(
        model=MODEL,
        max_tokens=100,
        system=[{"type": "text", "text": "sys"}],
        tools=[WEATHER_TOOL],
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
        stop_sequences=["###"],
        metadata={"user_id": "u1"},
        messages=[
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Oslo"}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "cold"}]},
        ],
    )
    chat = to_chat_request(sent[0])
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "assistant", "tool"]
    assert chat["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo"}'
    assert (chat["tool_choice"], chat["parallel_tool_calls"], chat["stop"], chat["user"]) == (
        "auto",
        False,
        ["###"],
        "u1",
    )


# --- refused requests -----------------------------------------------------------------------


def test_missing_max_tokens_is_a_400_in_anthropic_format():
    with pytest.raises(MessagesError) as caught:
        to_chat_request({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    error = caught.value
    assert (error.status, error.error_type, error.message) == (
        400,
        "invalid_request_error",
        "max_tokens: Field required",
    )
    body = orjson.loads(error.body())
    assert body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
    }
    ErrorResponse.model_validate(body)


@pytest.mark.parametrize(
    "tool",
    [
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
        {"type": "bash_20250124", "name": "bash"},
        {"type": "computer_20250124", "name": "computer", "display_width_px": 1024, "display_height_px": 768},
        {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
    ],
)
def test_server_tools_are_refused_by_name(tool: dict[str, Any]):
    with pytest.raises(MessagesError) as caught:
        to_chat_request({**REQUEST, "tools": [WEATHER_TOOL, tool]})
    assert caught.value.status == 400
    assert f"{tool['name']} ({tool['type']})" in caught.value.message
    assert caught.value.message.startswith("tools: server tools")


def test_several_server_tools_are_named_in_one_error():
    tools = [{"type": "web_search_20250305", "name": "web_search"}, {"type": "bash_20250124", "name": "bash"}]
    with pytest.raises(MessagesError, match=r"web_search \(web_search_20250305\), bash \(bash_20250124\)"):
        to_chat_request({**REQUEST, "tools": tools})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model": None}, "model: Field required"),
        ({"max_tokens": "64"}, "max_tokens: Input should be a valid integer"),
        ({"max_tokens": 0}, "max_tokens: Input should be greater than or equal to 1"),
        ({"messages": []}, "messages: at least one message is required"),
        ({"messages": "hi"}, "messages: Input should be a valid list"),
        ({"temperature": "hot"}, "temperature: Input should be a valid number"),
        ({"stop_sequences": ["ok", 3]}, "stop_sequences.1: Input should be a valid string"),
        ({"stream": "yes"}, "stream: Input should be a valid boolean"),
        ({"metadata": {"user_id": 7}}, "metadata.user_id: Input should be a valid string"),
        ({"tools": [{"name": "x"}]}, "tools.0.input_schema: Field required"),
        ({"mcp_servers": [{"type": "url", "url": "https://mcp.example", "name": "m"}]}, "mcp_servers: "),
        ({"messages": [{"role": "bot", "content": "x"}]}, "messages.0.role: Input should be"),
        ({"messages": [{"role": "user"}]}, "messages.0.content: Field required"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content: Input should be"),
    ],
)
def test_invalid_fields_are_named(change: dict[str, Any], message: str):
    with pytest.raises(MessagesError) as caught:
        to_chat_request({**REQUEST, **change})
    assert caught.value.status == 400 and caught.value.error_type == "invalid_request_error"
    assert caught.value.message.startswith(message)


def _third_message(content: list[dict[str, Any]], role: str = "user") -> dict[str, Any]:
    return {
        **REQUEST,
        "messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": role, "content": content},
        ],
    }


@pytest.mark.parametrize(
    ("content", "role", "message"),
    [
        ([{"type": "tool_result", "content": "x"}], "user", "messages.2.content.0.tool_use_id: Field required"),
        ([{"type": "text"}], "user", "messages.2.content.0.text: Field required"),
        ([{"type": "text", "text": 1}], "user", "messages.2.content.0.text: Input should be a valid string"),
        ([{"text": "no type"}], "user", "messages.2.content.0.type: Field required"),
        (
            [{"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}],
            "user",
            "messages.2.content.0: documents",
        ),
        (
            [{"type": "search_result", "source": "s", "title": "t", "content": []}],
            "user",
            "messages.2.content.0: search_result",
        ),
        (
            [{"type": "tool_use", "id": "t", "name": "n", "input": {}}],
            "user",
            "messages.2.content.0.type: tool_use blocks are only allowed in assistant messages",
        ),
        (
            [{"type": "tool_use", "id": "t", "name": "n", "input": "{}"}],
            "assistant",
            "messages.2.content.0.input: Input should be a valid dictionary",
        ),
        (
            [{"type": "tool_result", "tool_use_id": "t"}],
            "assistant",
            "messages.2.content.0.type: tool_result blocks are only allowed in user messages",
        ),
        (
            [{"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}}],
            "assistant",
            "messages.2.content.0.type: content blocks of type 'server_tool_use' are not supported",
        ),
        (
            [{"type": "image", "source": {"type": "file", "file_id": "f"}}],
            "user",
            "messages.2.content.0.source.type: file sources",
        ),
        (
            [{"type": "image", "source": {"type": "base64", "data": "x"}}],
            "user",
            "messages.2.content.0.source.media_type: Field required",
        ),
        (
            [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "document"}]}],
            "user",
            "messages.2.content.0.content.0: documents",
        ),
        (
            [{"type": "tool_result", "tool_use_id": "t", "is_error": "yes"}],
            "user",
            "messages.2.content.0.is_error: Input should be a valid boolean",
        ),
    ],
)
def test_invalid_content_blocks_are_named_by_path(content: list[dict[str, Any]], role: str, message: str):
    with pytest.raises(MessagesError) as caught:
        to_chat_request(_third_message(content, role))
    assert caught.value.status == 400
    assert caught.value.message.startswith(message), caught.value.message


def test_a_system_role_message_is_taken_and_an_assistant_prefill_passes_as_is():
    chat = to_chat_request(
        {
            **REQUEST,
            "messages": [
                {"role": "system", "content": [{"type": "text", "text": "late rule"}]},
                {"role": "user", "content": "Answer in JSON"},
                {"role": "assistant", "content": "{"},
            ],
        }
    )
    assert chat["messages"] == [
        {"role": "system", "content": "late rule"},
        {"role": "user", "content": "Answer in JSON"},
        {"role": "assistant", "content": "{"},
    ]


# --- answers --------------------------------------------------------------------------------


def completion(
    message: dict[str, Any], finish: str, usage: dict[str, Any] | None = None, **choice: Any
) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "upstream",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish, **choice}],
        "usage": usage or {"prompt_tokens": 30, "completion_tokens": 5, "total_tokens": 35},
    }


def test_a_text_answer_is_a_valid_message():
    chat = completion(
        {"content": "Hello!"},
        "stop",
        {"prompt_tokens": 120, "completion_tokens": 9, "prompt_tokens_details": {"cached_tokens": 100}},
        stop_reason=None,
    )
    message = to_message(chat, message_id=MESSAGE_ID, model=MODEL)
    assert message == {
        "id": MESSAGE_ID,
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": [{"type": "text", "text": "Hello!"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 20,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 100,
            "output_tokens": 9,
        },
    }
    validated_message(message)


def test_a_tool_use_answer():
    chat = completion(
        {
            "content": "Let me check.",
            "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}},
                {"id": "call_b", "type": "function", "function": {"name": "clock", "arguments": ""}},
                {"id": "call_c", "type": "function", "function": {"name": "broken", "arguments": '{"city": "Par'}},
                {"id": "call_d", "type": "function", "function": {"name": "listy", "arguments": "[1, 2]"}},
                {"id": "call_e", "type": "function", "function": {"name": "nan", "arguments": '{"x": NaN}'}},
            ],
        },
        "tool_calls",
    )
    message = validated_message(to_message(chat, message_id=MESSAGE_ID, model=MODEL))
    assert message.stop_reason == "tool_use"
    assert [block.type for block in message.content] == [
        "text",
        "tool_use",
        "tool_use",
        "tool_use",
        "tool_use",
        "tool_use",
    ]
    calls = [(b.id, b.name, b.input) for b in message.content if b.type == "tool_use"]
    assert calls == [
        ("call_a", "weather", {"city": "Paris"}),
        ("call_b", "clock", {}),
        ("call_c", "broken", {}),  # unparseable: {} (documented in to_message)
        ("call_d", "listy", {}),  # not an object: {}
        ("call_e", "nan", {}),  # not JSON
    ]


def test_forced_tool_with_finish_stop_is_still_tool_use_and_missing_ids_get_one():
    chat = completion({"content": None, "tool_calls": [{"function": {"name": "weather", "arguments": "{}"}}]}, "stop")
    message = validated_message(to_message(chat, message_id=MESSAGE_ID, model=MODEL))
    assert message.stop_reason == "tool_use"
    assert [(b.type, getattr(b, "id", None)) for b in message.content] == [("tool_use", "toolu_01test_0")]


@pytest.mark.parametrize(
    ("finish", "choice", "stop_reason", "stop_sequence"),
    [
        ("length", {}, "max_tokens", None),
        ("stop", {"stop_reason": "###"}, "stop_sequence", "###"),  # vLLM names the matched stop string
        ("stop", {"stop_reason": 151645}, "end_turn", None),  # a stop token id: end of turn
        ("content_filter", {}, "refusal", None),
        (None, {}, "end_turn", None),
    ],
)
def test_finish_reasons(finish: str | None, choice: dict[str, Any], stop_reason: str, stop_sequence: str | None):
    chat = completion({"content": "partial answ"}, finish, **choice)  # type: ignore[arg-type]
    message = validated_message(to_message(chat, message_id=MESSAGE_ID, model=MODEL))
    assert (message.stop_reason, message.stop_sequence) == (stop_reason, stop_sequence)


def test_an_empty_answer_without_usage_has_no_blocks_and_zero_counts():
    message = validated_message(to_message({"choices": []}, message_id=MESSAGE_ID, model=MODEL))
    assert message.content == [] and message.stop_reason == "end_turn"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (0, 0)


def test_a_refusal_is_text_with_stop_reason_refusal():
    chat = completion({"content": None, "refusal": "I can't help with that."}, "stop")
    message = validated_message(to_message(chat, message_id=MESSAGE_ID, model=MODEL))
    assert message.stop_reason == "refusal" and message.content[0].type == "text"


def test_the_sdk_reads_a_translated_answer_with_strict_validation():
    chat = completion(
        {
            "content": "Sure.",
            "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}
            ],
        },
        "tool_calls",
    )
    body = orjson.dumps(to_message(chat, message_id=MESSAGE_ID, model=MODEL))
    message = sdk_client(body, stream=False).messages.create(**REQUEST)
    assert message.id == MESSAGE_ID and message.stop_reason == "tool_use"
    assert message.content[1].type == "tool_use" and message.content[1].input == {"city": "Oslo"}

    # The agent sends the answer back in its next request: the chat form it translates to is
    # the recorded answer, which is what trajectory stitching hashes.
    sent: list[Any] = []
    follow_up = [{"role": "user", "content": "hi"}, message.to_param(), {"role": "user", "content": "go on"}]
    sdk_client(body, stream=False, sent=sent).messages.create(model=MODEL, max_tokens=64, messages=follow_up)
    assert to_chat_request(sent[0])["messages"][1] == chat["choices"][0]["message"]


# --- streams --------------------------------------------------------------------------------


def test_a_text_stream():
    chunks = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Hel"}),
        chunk({"content": ""}),
        chunk({"content": "lo, "}),
        chunk({"content": "world"}),
        chunk({}, "stop"),
        usage_chunk(42, 4, cached=40),
    ]
    events, final = assert_stream_matches(chunks)
    assert [name for name, _ in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0][1]["message"]
    assert (start["id"], start["model"], start["content"], start["usage"]["input_tokens"]) == (MESSAGE_ID, MODEL, [], 0)
    assert events[1][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert [data["delta"] for _, data in events[2:5]] == [
        {"type": "text_delta", "text": "Hel"},
        {"type": "text_delta", "text": "lo, "},
        {"type": "text_delta", "text": "world"},
    ]
    assert events[6][1] == {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {
            "input_tokens": 2,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 40,
            "output_tokens": 4,
        },
    }
    assert final.content[0].type == "text" and final.content[0].text == "Hello, world"
    assert (final.usage.input_tokens, final.usage.cache_read_input_tokens, final.usage.output_tokens) == (2, 40, 4)
    _, _, text = streamed_through_sdk(run_stream(chunks)[0])
    assert text == "Hello, world"


def test_a_tool_call_with_split_arguments():
    arguments = '{"city": "Par\\u00eds \\"centre\\"", "days": [1, 2.5e1, -0], "metric": true, "note": null}'
    chunks = [
        chunk({"role": "assistant", "content": ""}),
        tool_chunk(0, id="chatcmpl-tool-1", name="weather"),
        # every character its own fragment: cuts inside strings, escapes, numbers and literals
        *[tool_chunk(0, arguments=ch) for ch in arguments],
        chunk({}, "tool_calls"),
        usage_chunk(50, 30),
    ]
    events, final = assert_stream_matches(chunks)
    assert events[1][1]["content_block"] == {
        "type": "tool_use",
        "id": "chatcmpl-tool-1",
        "name": "weather",
        "input": {},
    }
    deltas = [data["delta"] for name, data in events if name == "content_block_delta"]
    assert all(d["type"] == "input_json_delta" for d in deltas)
    assert "".join(d["partial_json"] for d in deltas) == arguments
    tool = final.content[0]
    assert tool.type == "tool_use" and tool.input == json.loads(arguments)
    assert final.stop_reason == "tool_use"


def test_text_then_two_tool_calls():
    chunks = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Checking both."}),
        tool_chunk(0, id="call_a", name="weather", arguments=""),
        tool_chunk(0, arguments='{"city":'),
        tool_chunk(0, arguments=' "Paris"}'),
        tool_chunk(1, id="call_b", name="weather", arguments='{"city": "Oslo"}'),
        chunk({}, "tool_calls"),
        usage_chunk(80, 40),
    ]
    events, final = assert_stream_matches(chunks)
    starts = [(data["index"], data["content_block"]["type"]) for name, data in events if name == "content_block_start"]
    stops = [data["index"] for name, data in events if name == "content_block_stop"]
    assert starts == [(0, "text"), (1, "tool_use"), (2, "tool_use")]
    assert stops == [0, 1, 2]
    # blocks come one after another: each stops before the next starts
    order = [(name, data.get("index")) for name, data in events if name.startswith("content_block_")]
    assert order.index(("content_block_stop", 0)) < order.index(("content_block_start", 1))
    assert order.index(("content_block_stop", 1)) < order.index(("content_block_start", 2))
    assert [(b.type, getattr(b, "input", None)) for b in final.content] == [
        ("text", None),
        ("tool_use", {"city": "Paris"}),
        ("tool_use", {"city": "Oslo"}),
    ]


def test_usage_comes_from_the_usage_chunk_or_else_the_assembled_completion():
    chunks = [chunk({"content": "hi"}), chunk({}, "stop"), usage_chunk(11, 2)]
    events, _ = assert_stream_matches(chunks)
    assert events[-2][1]["usage"] == {
        "input_tokens": 11,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 2,
    }
    stream = MessagesStream(message_id=MESSAGE_ID, model=MODEL)
    stream.start()
    stream.feed(chunk({"content": "hi"}))
    tail = parse_events(
        stream.finish(
            {
                "choices": [{"index": 0, "finish_reason": "length"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 1},
            },
            None,
        )
    )
    assert tail[1][1]["delta"]["stop_reason"] == "max_tokens"
    assert tail[1][1]["usage"]["input_tokens"] == 5 and tail[1][1]["usage"]["output_tokens"] == 1


def test_a_stop_sequence_and_max_tokens_in_a_stream():
    events, final = assert_stream_matches([chunk({"content": "a"}), chunk({}, "length"), usage_chunk(3, 1)])
    assert final.stop_reason == "max_tokens"
    raw, _ = run_stream([chunk({"content": "a"}), chunk({}, "stop", stop_reason="###")])
    _, final, _ = streamed_through_sdk(raw)
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "###")


def test_an_empty_stream_is_a_message_without_blocks():
    events, final = assert_stream_matches([chunk({"role": "assistant", "content": ""}), chunk({}, "stop")])
    assert [name for name, _ in events] == ["message_start", "message_delta", "message_stop"]
    assert final.content == []


def test_an_upstream_that_breaks_off_ends_with_an_error_event():
    error = {
        "error": {
            "message": "upstream stream failed: ReadError: boom",
            "type": "upstream_error",
            "param": None,
            "code": "stream_interrupted",
        }
    }
    raw, _ = run_stream([chunk({"content": "par"})], error=error)
    events = parse_events(raw)
    assert [name for name, _ in events][-1] == "error"
    assert "message_stop" not in [name for name, _ in events]
    assert events[-1][1] == {
        "type": "error",
        "error": {"type": "api_error", "message": "upstream stream failed: ReadError: boom"},
    }
    with pytest.raises(anthropic.APIStatusError) as caught:
        with sdk_client(raw).messages.create(**REQUEST, stream=True) as stream:
            list(stream)
    assert caught.value.body == events[-1][1]
    # an Anthropic type, or a status, is kept
    assert b'"overloaded_error"' in MessagesStream(message_id="m", model="x").finish(
        None, {"status": 529, "message": "busy"}
    )


def test_an_error_object_inside_the_chat_stream_ends_the_stream():
    """vLLM writes `{"object": "error", ..., "code": <status>}` into a stream that fails late."""
    stream = MessagesStream(message_id=MESSAGE_ID, model=MODEL)
    raw = stream.start() + stream.feed(chunk({"content": "par"}))
    raw += stream.feed({"object": "error", "message": "out of KV cache", "type": "InternalServerError", "code": 503})
    assert stream.finish(None, None) == b""
    events = parse_events(raw)
    assert events[-1][1] == {"type": "error", "error": {"type": "overloaded_error", "message": "out of KV cache"}}
    with pytest.raises(anthropic.APIStatusError, match="out of KV cache"):
        with sdk_client(raw).messages.stream(**REQUEST) as helper:
            helper.get_final_message()


def test_tool_arguments_that_stop_being_json_are_held_back():
    """The SDK re-parses a tool's input after every fragment and fails the whole stream on
    invalid JSON: the fragment that breaks it, and what follows, are not sent."""
    chunks = [
        tool_chunk(0, id="call_a", name="run", arguments='  {"cmd": "ls", '),
        tool_chunk(0, arguments='"x": tru'),
        tool_chunk(0, arguments="ly}"),  # `truly`: not JSON
        tool_chunk(0, arguments='", "y": 1}'),
        chunk({}, "tool_calls"),
    ]
    raw, completion = run_stream(chunks)
    events = parse_events(raw)
    sent = "".join(data["delta"]["partial_json"] for name, data in events if name == "content_block_delta")
    assert sent == '{"cmd": "ls", "x": tru'
    _, final, _ = streamed_through_sdk(raw)  # no exception
    assert final.content[0].type == "tool_use" and final.content[0].input == {"cmd": "ls"}
    assert to_message(completion, message_id=MESSAGE_ID, model=MODEL)["content"][0]["input"] == {}


@pytest.mark.parametrize(
    ("arguments", "sent"),
    [
        ('{"a": 01}', '{"a": 0'),
        ('{"a": 1} {', '{"a": 1} '),
        ('{"a": "\x01"}', '{"a": "'),
        ('{"a": "\\x"}', '{"a": "\\'),
        ('{"a": [1,]}', '{"a": [1,'),
        ('{"a" 1}', '{"a" '),
        ("[1, 2]", ""),
        ('{"a": -}', '{"a": -'),
        ('{"a": 1.e5}', '{"a": 1.'),
        ('{"a": nul}', '{"a": nul'),
        ('{"a": {"b": [true, false, null, "\\u00e9", 1E+2]}}', '{"a": {"b": [true, false, null, "\\u00e9", 1E+2]}}'),
    ],
)
def test_only_a_json_object_prefix_is_sent(arguments: str, sent: str):
    chunks = [tool_chunk(0, id="call_a", name="f"), *[tool_chunk(0, arguments=ch) for ch in arguments]]
    raw, _ = run_stream([*chunks, chunk({}, "tool_calls")])
    events = parse_events(raw)
    assert "".join(data["delta"]["partial_json"] for name, data in events if name == "content_block_delta") == sent
    streamed_through_sdk(raw)  # the SDK's partial parser accepts every prefix sent


def test_a_nameless_or_id_less_call_still_gets_a_block():
    chunks = [
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"a"'}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"name": "f"}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]
    events, final = assert_stream_matches(chunks)
    assert final.content[0].type == "tool_use"
    assert (final.content[0].id, final.content[0].name, final.content[0].input) == ("toolu_01test_0", "f", {"a": 1})


def test_feed_and_finish_after_finish_send_nothing_and_ping_is_valid():
    stream = MessagesStream(message_id=MESSAGE_ID, model=MODEL)
    stream.start()
    stream.finish(None, None)
    assert stream.feed(chunk({"content": "late"})) == b"" and stream.finish(None, None) == b""
    assert parse_events(MessagesStream.ping()) == [("ping", {"type": "ping"})]


# --- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "error_type", "exception"),
    [
        (400, "invalid_request_error", anthropic.BadRequestError),
        (401, "authentication_error", anthropic.AuthenticationError),
        (403, "permission_error", anthropic.PermissionDeniedError),
        (404, "not_found_error", anthropic.NotFoundError),
        (413, "request_too_large", anthropic.APIStatusError),
        (422, "invalid_request_error", anthropic.UnprocessableEntityError),
        (429, "rate_limit_error", anthropic.RateLimitError),
        (500, "api_error", anthropic.InternalServerError),
        (502, "api_error", anthropic.APIStatusError),
        (503, "overloaded_error", anthropic.APIStatusError),
        (504, "timeout_error", anthropic.APIStatusError),
        (529, "overloaded_error", anthropic.APIStatusError),
    ],
)
def test_error_bodies_by_status(status: int, error_type: str, exception: type[Exception]):
    body = error_body(status, "something went wrong")
    assert orjson.loads(body) == {"type": "error", "error": {"type": error_type, "message": "something went wrong"}}
    if error_type != "request_too_large":  # Anthropic documents it; the SDK's error union lacks it
        ErrorResponse.model_validate(orjson.loads(body))
    with pytest.raises(exception) as caught:
        sdk_client(body, status=status, stream=False).messages.create(**REQUEST)
    assert caught.value.status_code == status  # type: ignore[attr-defined]
    assert caught.value.body == orjson.loads(body)  # type: ignore[attr-defined]


def test_openai_errors_are_rewritten():
    raw = b'{"error": {"message": "model not found", "type": "invalid_request_error", "code": null}}'
    assert orjson.loads(from_openai_error(404, raw)) == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "model not found"},
    }
    assert orjson.loads(from_openai_error(500, b'{"error": "boom"}'))["error"]["message"] == "boom"
    assert orjson.loads(from_openai_error(502, b"Bad Gateway"))["error"] == {
        "type": "api_error",
        "message": "Bad Gateway",
    }


# --- count_tokens ---------------------------------------------------------------------------


def test_count_tokens_text_covers_system_messages_and_tools():
    text = count_tokens_text(
        {
            "model": MODEL,
            "system": "Be brief.",
            "tools": [WEATHER_TOOL],
            "messages": [
                {"role": "user", "content": "weather?"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "weather", "input": {"city": "Oslo"}}],
                },
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "cold"}]},
            ],
        }
    )
    assert text.split("\n") == [
        "system",
        "Be brief.",
        "user",
        "weather?",
        "assistant",
        'weather {"city": "Oslo"}',
        "tool",
        "cold",
        "weather",
        "Current weather",
        json.dumps(WEATHER_TOOL["input_schema"]),
    ]
    assert estimate_tokens(text) == -(-len(text.encode()) // 4)
    assert estimate_tokens("日本語") == 3  # 9 bytes
    with pytest.raises(MessagesError, match="messages: Field required"):
        count_tokens_text({"model": MODEL})
