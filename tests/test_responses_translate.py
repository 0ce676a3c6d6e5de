"""The Responses API over chat completions: request and answer translation, and streams.

Pure unit tests: no gateway, no database. What is produced is checked against the official
`openai` SDK: its pydantic models (Response, ResponseStreamEvent, ResponseItem) and, for
streams, the SDK client itself reading our bytes through an in-process transport.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import httpx2
import openai
import orjson
import pytest
from openai.types.responses import Response, ResponseItem, ResponseStreamEvent
from openai.types.responses.response_create_params import ResponseCreateParamsStreaming
from pydantic import TypeAdapter

from gateway.endpoints.chat_completions.assembly import assemble_completion
from gateway.endpoints.responses.stream import ResponsesStream
from gateway.endpoints.responses.translate import (
    RESPONSES_FIELDS,
    continued_messages,
    input_items,
    to_chat_request,
    to_response,
)
from gateway.http.errors import GatewayError
from gateway.trajectories.stitching import message_digest

EVENTS = TypeAdapter(ResponseStreamEvent)
ITEMS = TypeAdapter(ResponseItem)
RESPONSE_ID = "resp_0123456789abcdef"
CREATED = 1_750_000_000.0

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": True,
}
TIME_TOOL = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}


# ---------------------------------------------------------------- request: Responses -> chat


def test_a_string_input_is_one_user_message():
    chat = to_chat_request({"model": "policy-a", "input": "Hello"})
    assert chat == {"model": "policy-a", "messages": [{"role": "user", "content": "Hello"}]}


def test_messages_with_parts_become_chat_messages():
    chat = to_chat_request(
        {
            "model": "policy-a",
            "input": [
                {"role": "developer", "content": "Be brief."},  # EasyInputMessage: no type
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "What is in this image?"},
                        {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "low"},
                    ],
                },
                {
                    "type": "message",
                    "id": "msg_1",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "A cat.", "annotations": []}],
                },
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Sure?"}]},
            ],
        }
    )
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},  # developer: what open models' templates call system
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this image?"},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "low"}},
            ],
        },
        {"role": "assistant", "content": "A cat."},  # one text part: a plain string
        {"role": "user", "content": "Sure?"},
    ]


def test_a_multi_turn_run_with_function_calls_and_outputs():
    chat = to_chat_request(
        {
            "model": "policy-a",
            "instructions": "You are a weather bot.",
            "tools": [WEATHER_TOOL],
            "input": [
                {"role": "user", "content": "Weather in Paris and Rome?"},
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": "."}],
                },
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
                {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city":"Rome"}'},
                {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
                {
                    "type": "function_call_output",
                    "call_id": "call_2",
                    "output": [{"type": "input_text", "text": "21C"}],
                },
                {"type": "function_call", "call_id": "call_3", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
                {"type": "function_call_output", "call_id": "call_3", "output": "4C"},
            ],
        }
    )
    call = lambda id_, city: {
        "id": id_,
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": city}, separators=(",", ":"))},
    }
    assert chat["messages"] == [
        {"role": "system", "content": "You are a weather bot."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        # the reasoning item is dropped; the text and both calls are one assistant turn
        {"role": "assistant", "content": "Checking.", "tool_calls": [call("call_1", "Paris"), call("call_2", "Rome")]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "21C"},
        {"role": "assistant", "content": None, "tool_calls": [call("call_3", "Oslo")]},
        {"role": "tool", "tool_call_id": "call_3", "content": "4C"},
    ]
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather in a city",
                "parameters": WEATHER_TOOL["parameters"],
                "strict": True,
            },
        }
    ]


def test_instructions_lead_and_the_previous_conversation_follows():
    previous = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
            ],
        },
    ]
    chat = to_chat_request(
        {
            "model": "policy-a",
            "instructions": "New instructions.",
            "previous_response_id": "resp_prev",
            "input": [{"type": "function_call_output", "call_id": "call_9", "output": "18C"}],
        },
        previous,
    )
    assert chat["messages"] == [
        {"role": "system", "content": "New instructions."},
        *previous,
        {"role": "tool", "tool_call_id": "call_9", "content": "18C"},
    ]
    assert "previous_response_id" not in chat


def _answer(content: str | None, tool_calls: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content, **extra}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "policy-a",
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop", "logprobs": None}
        ],
        "usage": {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27},
    }


def test_previous_response_and_replayed_output_give_the_same_chat_form():
    """Two ways to continue a run: previous_response_id, or the client sends the output items back
    (store=false). Both must give the chat messages the first call's chat form continues, so the
    calls stitch into one trajectory and train as one conversation."""
    first = {"model": "policy-a", "instructions": "Be a weather bot.", "tools": [WEATHER_TOOL], "input": "Paris?"}
    first_chat = to_chat_request(first)
    calls = [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"P"}'}}]
    answer = _answer("Let me check.", calls, reasoning_content="Use the tool.")
    response = to_response(answer, response_id=RESPONSE_ID, request=first, created_at=CREATED)

    output = [{"type": "function_call_output", "call_id": "call_1", "output": "18C"}]
    by_reference = to_chat_request(
        {**first, "input": output, "previous_response_id": RESPONSE_ID},
        continued_messages(first, first_chat, answer),
    )
    replayed = to_chat_request(
        {**first, "input": [{"role": "user", "content": "Paris?"}, *response["output"], *output]}
    )
    assert by_reference["messages"] == replayed["messages"]
    assert by_reference["messages"][: len(first_chat["messages"])] == first_chat["messages"]
    recorded = [*first_chat["messages"], answer["choices"][0]["message"]]
    assert [message_digest(m) for m in replayed["messages"][: len(recorded)]] == [message_digest(m) for m in recorded]


def test_without_instructions_the_conversation_continues_whole():
    first = {"model": "policy-a", "input": [{"role": "system", "content": "Rules."}, {"role": "user", "content": "Hi"}]}
    first_chat = to_chat_request(first)
    carried = continued_messages(first, first_chat, _answer("Hello."))
    assert carried == [*first_chat["messages"], {"role": "assistant", "content": "Hello."}]
    second = to_chat_request({"model": "policy-a", "instructions": "Now terse.", "input": "More?"}, carried)
    assert second["messages"] == [
        {"role": "system", "content": "Now terse."},
        *carried,
        {"role": "user", "content": "More?"},
    ]


def test_tools_and_tool_choice():
    body = {"model": "policy-a", "input": "hi", "tools": [WEATHER_TOOL, TIME_TOOL], "parallel_tool_calls": False}
    assert to_chat_request({**body, "tool_choice": "required"})["tool_choice"] == "required"
    chat = to_chat_request({**body, "tool_choice": {"type": "function", "name": "get_time"}})
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_time"}}
    assert chat["parallel_tool_calls"] is False
    assert chat["tools"][1] == {
        "type": "function",
        "function": {"name": "get_time", "parameters": TIME_TOOL["parameters"]},
    }
    allowed = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_time"}]}
    chat = to_chat_request({**body, "tool_choice": allowed})
    assert chat["tool_choice"] == "required"
    assert [tool["function"]["name"] for tool in chat["tools"]] == ["get_time"]
    # a choice without tools says nothing a chat endpoint needs
    assert "tool_choice" not in to_chat_request({"model": "policy-a", "input": "hi", "tool_choice": "auto"})


def test_text_format_becomes_response_format():
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    body = {"model": "policy-a", "input": "hi"}
    chat = to_chat_request(
        {**body, "text": {"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}}}
    )
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": schema, "strict": True},
    }
    chat = to_chat_request({**body, "text": {"format": {"type": "json_object"}}})
    assert chat["response_format"] == {"type": "json_object"}
    assert "response_format" not in to_chat_request({**body, "text": {"format": {"type": "text"}, "verbosity": "low"}})


def test_sampling_fields_are_translated_and_service_fields_dropped():
    chat = to_chat_request(
        {
            "model": "policy-a",
            "input": "hi",
            "temperature": 0.7,
            "top_p": 0.9,
            "max_output_tokens": 256,
            "user": "u-1",
            "metadata": {"trajectory_id": "run-1"},
            "seed": 7,
            "stream": True,
            "include": ["message.output_text.logprobs", "reasoning.encrypted_content"],
            "top_logprobs": 3,
            "store": False,
            "reasoning": {"effort": "high", "summary": "auto"},
            "truncation": "auto",
            "prompt_cache_key": "k",
            "service_tier": "auto",
            "stream_options": {"include_obfuscation": False},
            "top_k": 20,  # not a Responses field: vLLM's, passed through as chat passes it
        }
    )
    assert chat == {
        "model": "policy-a",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.7,
        "top_p": 0.9,
        "max_tokens": 256,
        "user": "u-1",
        "metadata": {"trajectory_id": "run-1"},
        "seed": 7,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logprobs": True,
        "top_logprobs": 3,
        "top_k": 20,
    }


def test_every_responses_request_field_is_translated_dropped_or_refused():
    """A field the SDK gains later must be placed deliberately, not leak to the upstream."""
    assert set(ResponseCreateParamsStreaming.__annotations__) <= RESPONSES_FIELDS


def _error(body: dict[str, Any], previous: list[dict[str, Any]] | None = None) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        to_chat_request(body, previous)
    assert caught.value.status == 400
    return caught.value


@pytest.mark.parametrize(
    ("changes", "param", "code"),
    [
        ({"model": None}, "model", "missing_required_parameter"),
        ({"model": 3}, "model", "invalid_type"),
        ({"input": None}, "input", "missing_required_parameter"),
        ({"input": {"role": "user"}}, "input", "invalid_type"),
        ({"input": ["hi"]}, "input[0]", "invalid_type"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "invalid_value"),
        ({"input": [{"role": "user"}]}, "input[0].content", "missing_required_parameter"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0].type",
            "unsupported_value",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
            "input[0].content[0].file_id",
            "unsupported_parameter",
        ),
        (
            {"input": [{"role": "system", "content": [{"type": "input_image", "image_url": "u"}]}]},
            "input[0].content[0].type",
            "invalid_value",
        ),
        (
            {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
            "input[0].call_id",
            "missing_required_parameter",
        ),
        (
            {
                "input": [
                    {"role": "user", "content": "a"},
                    {"type": "function_call_output", "call_id": "nope", "output": "x"},
                ]
            },
            "input[1].call_id",
            "invalid_value",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "unsupported_value"),
        ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0].type", "unsupported_value"),
        ({"tools": [WEATHER_TOOL, {"type": "web_search"}]}, "tools[1].type", "unsupported_value"),
        ({"tools": [{"type": "function"}]}, "tools[0].name", "missing_required_parameter"),
        (
            {"tools": [WEATHER_TOOL], "tool_choice": {"type": "web_search_preview"}},
            "tool_choice.type",
            "unsupported_value",
        ),
        (
            {"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "name": "nope"}},
            "tool_choice.name",
            "invalid_value",
        ),
        ({"tool_choice": "required"}, "tool_choice", "invalid_value"),
        ({"tool_choice": "sometimes"}, "tool_choice", "invalid_value"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema", "invalid_type"),
        ({"text": {"format": {"type": "yaml"}}}, "text.format.type", "invalid_value"),
        ({"max_output_tokens": "many"}, "max_output_tokens", "invalid_type"),
        ({"max_output_tokens": 0}, "max_output_tokens", "invalid_value"),
        ({"temperature": True}, "temperature", "invalid_type"),
        ({"top_logprobs": 50}, "top_logprobs", "invalid_value"),
        ({"stream": "yes"}, "stream", "invalid_type"),
        ({"metadata": {"k": 1}}, "metadata.k", "invalid_type"),
        ({"background": True}, "background", "unsupported_value"),
        ({"previous_response_id": 5}, "previous_response_id", "invalid_type"),
        ({"truncation": "middle"}, "truncation", "invalid_value"),
        ({"reasoning": "high"}, "reasoning", "invalid_type"),
        ({"conversation": "conv_1"}, "conversation", "unsupported_parameter"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt", "unsupported_parameter"),
    ],
)
def test_invalid_requests_are_refused_with_their_param(changes: dict[str, Any], param: str, code: str):
    body = {"model": "policy-a", "input": "hi", **changes}
    error = _error({k: v for k, v in body.items() if not (k in ("model", "input") and v is None)})
    assert (error.param, error.code) == (param, code)
    assert error.error_type == "invalid_request_error"


def test_a_builtin_tool_is_refused_with_a_clear_message():
    error = _error({"model": "policy-a", "input": "hi", "tools": [{"type": "web_search"}]})
    assert "function tools only" in error.message and "web_search" in error.message


# ---------------------------------------------------------------- response: chat -> Responses

REQUEST = {"model": "policy-a", "input": "hi", "tools": [WEATHER_TOOL], "instructions": "Be brief.", "metadata": {}}


def test_a_text_answer_is_a_completed_response():
    response = to_response(_answer("Hello there."), response_id=RESPONSE_ID, request=REQUEST, created_at=CREATED)
    parsed = Response.model_validate(response)
    assert parsed.status == "completed" and parsed.output_text == "Hello there."
    assert parsed.id == RESPONSE_ID and parsed.model == "policy-a" and parsed.created_at == CREATED
    assert parsed.instructions == "Be brief." and parsed.tools[0].type == "function"
    assert [item.type for item in parsed.output] == ["message"]
    assert parsed.output[0].id.startswith("msg_") and parsed.output[0].status == "completed"
    assert parsed.usage is not None
    assert (parsed.usage.input_tokens, parsed.usage.output_tokens, parsed.usage.total_tokens) == (20, 7, 27)
    assert parsed.error is None and parsed.incomplete_details is None
    again = to_response(_answer("Hello there."), response_id=RESPONSE_ID, request=REQUEST, created_at=CREATED)
    assert again == response  # ids are derived, not random


def test_tool_calls_are_function_call_items():
    calls = [
        {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
        {"id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}},
    ]
    response = to_response(_answer(None, calls), response_id=RESPONSE_ID, request=REQUEST, created_at=CREATED)
    parsed = Response.model_validate(response)
    assert [item.type for item in parsed.output] == ["function_call", "function_call"]
    first, second = parsed.output
    assert first.type == "function_call" and second.type == "function_call"
    assert (first.call_id, first.name, first.arguments, first.status) == (
        "call_a",
        "get_weather",
        '{"city":"Paris"}',
        "completed",
    )
    assert second.call_id == "call_b" and first.id != second.id and (first.id or "").startswith("fc_")

    with_text = to_response(_answer("Checking.", calls), response_id=RESPONSE_ID, request=REQUEST, created_at=CREATED)
    assert [item["type"] for item in with_text["output"]] == ["message", "function_call", "function_call"]


def test_a_length_cut_is_an_incomplete_response():
    chat = _answer("It was a dark and")
    chat["choices"][0]["finish_reason"] = "length"
    response = to_response(chat, response_id=RESPONSE_ID, request=REQUEST, created_at=CREATED, completed_at=CREATED + 1)
    parsed = Response.model_validate(response)
    assert parsed.status == "incomplete"
    assert parsed.incomplete_details is not None and parsed.incomplete_details.reason == "max_output_tokens"
    assert parsed.output[0].status == "incomplete" and parsed.completed_at is None


def test_reasoning_and_logprobs():
    chat = _answer("Yes.", reasoning_content="Think first.")
    chat["choices"][0]["logprobs"] = {
        "content": [
            {
                "token": "Yes",
                "logprob": -0.1,
                "bytes": [89, 101, 115],
                "top_logprobs": [{"token": "No", "logprob": -2.5}],
            },
            {"token": ".", "logprob": -0.01, "bytes": [46], "top_logprobs": []},
        ]
    }
    request = {**REQUEST, "include": ["message.output_text.logprobs"]}
    parsed = Response.model_validate(to_response(chat, response_id=RESPONSE_ID, request=request, created_at=CREATED))
    reasoning, message = parsed.output
    assert reasoning.type == "reasoning" and reasoning.content and reasoning.content[0].text == "Think first."
    assert message.type == "message" and message.content[0].type == "output_text"
    logprobs = message.content[0].logprobs or []
    assert [(lp.token, lp.bytes, lp.logprob) for lp in logprobs] == [("Yes", [89, 101, 115], -0.1), (".", [46], -0.01)]
    assert logprobs[0].top_logprobs[0].token == "No" and logprobs[0].top_logprobs[0].bytes == [78, 111]
    not_asked = to_response(chat, response_id=RESPONSE_ID, request=REQUEST, created_at=CREATED)
    assert not_asked["output"][1]["content"][0]["logprobs"] == []


def test_an_empty_answer_is_an_empty_message():
    parsed = Response.model_validate(
        to_response(_answer(""), response_id=RESPONSE_ID, request=REQUEST, created_at=CREATED)
    )
    assert [item.type for item in parsed.output] == ["message"] and parsed.output_text == ""


def test_input_items_have_ids_and_validate():
    body = {
        "model": "policy-a",
        "input": [
            {"role": "user", "content": "hi"},
            {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "u"}]},
            {
                "type": "message",
                "id": "msg_given",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "x"}],
            },
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "18C"},
        ],
    }
    items = input_items(body, response_id=RESPONSE_ID)
    parsed = [ITEMS.validate_python(item) for item in items]
    assert [item.type for item in parsed] == ["message"] * 3 + ["reasoning", "function_call", "function_call_output"]
    assert items[2]["id"] == "msg_given" and items[0]["content"] == [{"type": "input_text", "text": "hi"}]
    assert len({item["id"] for item in items}) == len(items)
    assert input_items(body, response_id=RESPONSE_ID) == items
    assert input_items({"model": "m", "input": "hi"})[0]["id"] == input_items({"model": "m", "input": "hi"})[0]["id"]


# ---------------------------------------------------------------- streams


def _chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish, "token_ids": [1]}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "policy-a",
        "choices": [choice],
        **extra,
    }


USAGE_CHUNK = {
    "id": "chatcmpl-1",
    "object": "chat.completion.chunk",
    "created": 1,
    "model": "policy-a",
    "choices": [],
    "usage": {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42},
}

TEXT_CHUNKS = [
    _chunk({"role": "assistant", "content": ""}),
    _chunk({"content": "Hel"}),
    _chunk({"content": ""}),
    _chunk({"content": "lo, "}),
    _chunk({"content": "world."}),
    _chunk({}, "stop"),
    USAGE_CHUNK,
]


def _call_delta(index: int, *, id_: str | None = None, name: str | None = None, arguments: str = "") -> dict[str, Any]:
    delta: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if id_:
        delta["id"], delta["type"] = id_, "function"
        delta["function"]["name"] = name
    return {"tool_calls": [delta]}


TOOL_CHUNKS = [
    _chunk({"role": "assistant", "content": ""}),
    _chunk(_call_delta(0, id_="chatcmpl-tool-a", name="get_weather")),
    _chunk(_call_delta(0, arguments='{"ci')),
    _chunk(_call_delta(0, arguments='ty": "Par')),
    _chunk(_call_delta(0, arguments='is"}')),
    _chunk(_call_delta(1, id_="chatcmpl-tool-b", name="get_weather", arguments='{"city"')),
    _chunk(_call_delta(1, arguments=': "Rome"}')),
    _chunk({}, "tool_calls"),
    USAGE_CHUNK,
]


def _stream(
    chunks: list[dict[str, Any]],
    request: dict[str, Any] = REQUEST,
    *,
    error: dict[str, Any] | None = None,
    chat: dict[str, Any] | None = None,
) -> bytes:
    stream = ResponsesStream(response_id=RESPONSE_ID, request=request, created_at=CREATED)
    out = stream.start() + b"".join(stream.feed(chunk) for chunk in chunks)
    return out + stream.finish(chat, error)


def _events(raw: bytes) -> list[dict[str, Any]]:
    """Parse our SSE bytes, validating each event with the SDK and the framing and numbering."""
    assert raw.endswith(b"\n\n")
    events = []
    for block in raw[:-2].split(b"\n\n"):
        event_line, data_line = block.split(b"\n")
        data = orjson.loads(data_line.removeprefix(b"data: "))
        assert event_line == b"event: " + data["type"].encode()
        EVENTS.validate_python(data)
        events.append(data)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    return events


def _closing(events: list[dict[str, Any]]) -> dict[str, Any]:
    assert events[-1]["type"] in ("response.completed", "response.incomplete", "response.failed")
    return events[-1]["response"]


def test_a_text_stream():
    events = _events(_stream(TEXT_CHUNKS))
    types = [event["type"] for event in events]
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    text = "".join(event["delta"] for event in events if event["type"] == "response.output_text.delta")
    assert text == "Hello, world." == events[7]["text"]
    completed = _closing(events)
    assert completed == to_response(
        assemble_completion(TEXT_CHUNKS), response_id=RESPONSE_ID, request=REQUEST, created_at=CREATED
    )
    usage = Response.model_validate(completed).usage
    assert usage is not None and usage.total_tokens == 42


def test_two_parallel_tool_calls_with_split_arguments():
    events = _events(_stream(TOOL_CHUNKS))
    added = [event["item"] for event in events if event["type"] == "response.output_item.added"]
    assert [(item["type"], item["call_id"], item["arguments"]) for item in added] == [
        ("function_call", "chatcmpl-tool-a", ""),
        ("function_call", "chatcmpl-tool-b", ""),
    ]
    for output_index, arguments in [(0, '{"city": "Paris"}'), (1, '{"city": "Rome"}')]:
        deltas = [
            event["delta"]
            for event in events
            if event["type"] == "response.function_call_arguments.delta" and event["output_index"] == output_index
        ]
        done = [
            event
            for event in events
            if event["type"] == "response.function_call_arguments.done" and event["output_index"] == output_index
        ]
        assert "".join(deltas) == arguments == done[0]["arguments"]
    completed = _closing(events)
    assert events[-1]["type"] == "response.completed"
    assert completed == to_response(
        assemble_completion(TOOL_CHUNKS), response_id=RESPONSE_ID, request=REQUEST, created_at=CREATED
    )
    assert [item["status"] for item in completed["output"]] == ["completed", "completed"]


def test_reasoning_then_text_then_a_tool_call():
    chunks = [
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"reasoning_content": "The user wants "}),
        _chunk({"reasoning_content": "weather."}),
        _chunk({"content": "Checking."}),
        _chunk(_call_delta(0, id_="call_x", name="get_weather", arguments='{"city": "Oslo"}')),
        _chunk({}, "tool_calls"),
        USAGE_CHUNK,
    ]
    events = _events(_stream(chunks))
    completed = _closing(events)
    assert [item["type"] for item in completed["output"]] == ["reasoning", "message", "function_call"]
    assert completed == to_response(
        assemble_completion(chunks), response_id=RESPONSE_ID, request=REQUEST, created_at=CREATED
    )
    reasoning = "".join(event["delta"] for event in events if event["type"] == "response.reasoning_text.delta")
    assert reasoning == "The user wants weather." == completed["output"][0]["content"][0]["text"]


def test_text_after_a_tool_call_joins_the_one_message():
    """Chat streams may add to any item until they end; items close together in finish()."""
    chunks = [
        _chunk(_call_delta(0, id_="call_x", name="get_weather", arguments='{"city": "Oslo"}')),
        _chunk({"content": "Calling the tool."}),
        _chunk({}, "tool_calls"),
        USAGE_CHUNK,
    ]
    events = _events(_stream(chunks))
    completed = _closing(events)
    assert [item["type"] for item in completed["output"]] == ["function_call", "message"]  # the order they came in
    expected = to_response(assemble_completion(chunks), response_id=RESPONSE_ID, request=REQUEST, created_at=CREATED)
    assert sorted(completed["output"], key=lambda item: item["type"]) == sorted(
        expected["output"], key=lambda item: item["type"]
    )
    done = [event["type"] for event in events if event["type"].endswith(".done")]
    assert done[-1] == "response.output_item.done" and events[-1]["type"] == "response.completed"


def test_a_length_cut_stream_ends_with_response_incomplete():
    chunks = [*TEXT_CHUNKS[:5], _chunk({}, "length"), USAGE_CHUNK]
    events = _events(_stream(chunks))
    assert events[-1]["type"] == "response.incomplete"
    incomplete = _closing(events)
    assert incomplete["incomplete_details"] == {"reason": "max_output_tokens"}
    done = [event["item"] for event in events if event["type"] == "response.output_item.done"]
    assert done[0]["status"] == "incomplete"
    assert incomplete == to_response(
        assemble_completion(chunks), response_id=RESPONSE_ID, request=REQUEST, created_at=CREATED
    )


def test_logprobs_stream_with_the_text_when_asked():
    def lp(token: str) -> dict[str, Any]:
        return {"token": token, "logprob": -0.5, "bytes": list(token.encode()), "top_logprobs": []}

    chunks = []
    for token in ("Hi", " there"):
        chunk = _chunk({"content": token})
        chunk["choices"][0]["logprobs"] = {"content": [lp(token)]}
        chunks.append(chunk)
    chunks += [_chunk({}, "stop"), USAGE_CHUNK]
    request = {**REQUEST, "include": ["message.output_text.logprobs"]}
    events = _events(_stream(chunks, request))
    deltas = [event for event in events if event["type"] == "response.output_text.delta"]
    assert [event["logprobs"][0]["token"] for event in deltas] == ["Hi", " there"]
    assert _closing(events) == to_response(
        assemble_completion(chunks), response_id=RESPONSE_ID, request=request, created_at=CREATED
    )
    unasked = _events(_stream(chunks))
    assert all(event["logprobs"] == [] for event in unasked if event["type"] == "response.output_text.delta")


def test_an_upstream_that_breaks_off_fails_the_response():
    error = {"error": {"message": "engine died", "type": "InternalServerError", "code": 500}}
    events = _events(_stream(TEXT_CHUNKS[:3], error=error))
    assert events[-1]["type"] == "response.failed"
    failed = Response.model_validate(_closing(events))
    assert failed.status == "failed" and failed.error is not None
    assert (failed.error.code, failed.error.message) == ("server_error", "engine died")
    assert failed.output[0].type == "message" and failed.output[0].status == "incomplete"
    assert failed.output_text == "Hel"


def test_an_answer_without_chunks_is_streamed_from_the_completion():
    calls = [{"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]
    chat = _answer("Checking.", calls)
    events = _events(_stream([], chat=chat))
    assert _closing(events) == to_response(chat, response_id=RESPONSE_ID, request=REQUEST, created_at=CREATED)


def test_an_empty_stream_answers_an_empty_message():
    chunks = [_chunk({"role": "assistant", "content": ""}), _chunk({}, "stop")]
    events = _events(_stream(chunks))
    completed = _closing(events)
    assert [item["type"] for item in completed["output"]] == ["message"]
    assert completed == to_response(
        assemble_completion(chunks), response_id=RESPONSE_ID, request=REQUEST, created_at=CREATED
    )


# ---------------------------------------------------------------- the SDK reading our bytes


def _client(raw: bytes) -> openai.OpenAI:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=raw)

    transport = httpx2.MockTransport(handler)
    return openai.OpenAI(
        api_key="sk-test", base_url="http://gateway/v1", http_client=httpx2.Client(transport=transport)
    )


@pytest.mark.parametrize("chunks", [TEXT_CHUNKS, TOOL_CHUNKS], ids=["text", "tool-calls"])
def test_the_sdk_streams_and_accumulates_our_events(chunks: list[dict[str, Any]]):
    raw = _stream(copy.deepcopy(chunks))
    expected = Response.model_validate(_closing(_events(raw)))

    events = list(_client(raw).responses.create(model="policy-a", input="hi", stream=True))
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert events[-1].type == "response.completed" and events[-1].response == expected

    with _client(raw).responses.stream(model="policy-a", input="hi", tools=[WEATHER_TOOL]) as stream:  # type: ignore[list-item]
        texts = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.id == RESPONSE_ID and final.output_text == "".join(texts) == expected.output_text
    identities = [(item.type, getattr(item, "id", None)) for item in final.output]
    assert identities == [(item.type, getattr(item, "id", None)) for item in expected.output]
    calls = [item for item in final.output if item.type == "function_call"]
    assert [(call.call_id, json.loads(call.arguments)) for call in calls] == [
        (item.call_id, json.loads(item.arguments)) for item in expected.output if item.type == "function_call"
    ]
