"""POST /v1/messages with the official anthropic SDK: forwarded natively to an upstream that
speaks it, translated for a policy; recorded once each with its trajectory; errors in
Anthropic's format; count_tokens."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import pytest

from tests.conftest import wait_for

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture
def gateway(start_gateway, fake_upstream):
    model_list = [
        {
            "model_name": "fake-model",
            "litellm_params": {"model": "openai/fake-model", "api_base": fake_upstream.api_base, "api_key": "sk-x"},
        },
        {
            "model_name": "claude-fake",
            "litellm_params": {
                "model": "anthropic/claude-fake-1",
                "api_base": fake_upstream.api_base,
                "api_key": "sk-ant-upstream",
            },
        },
    ]
    policy = {
        "name": "agent",
        "base_model": "fake-model",
        "endpoints": [fake_upstream.api_base],
        "record_tokens": False,
    }
    return start_gateway(model_list=model_list, policies=[policy])


@pytest.fixture
def client(gateway) -> anthropic.Anthropic:
    # ANTHROPIC_BASE_URL is the gateway's root: the SDK adds /v1/messages.
    return anthropic.Anthropic(base_url=gateway.url, api_key="gateway-key", max_retries=0)


def _call(db, message_id: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        cursor = db.execute(
            "SELECT protocol, request, response, native_request, native_response, stream, upstream_model, "
            "trajectory_id::text AS trajectory_id, prompt_tokens, completion_tokens FROM calls WHERE response_id = %s",
            (message_id,),
        )
        rows = cursor.fetchall()
        return dict(zip([c.name for c in cursor.description], rows[0], strict=True)) if len(rows) == 1 else None

    return wait_for(found, message=f"the call of {message_id} recorded once")


def test_forwarded_natively_to_an_upstream_that_speaks_messages(client, db):
    message = client.messages.create(
        model="claude-fake", max_tokens=64, messages=[{"role": "user", "content": "Hello there"}]
    )
    assert message.content[0].type == "text" and message.content[0].text == "native messages: Hello there"
    recorded = _call(db, message.id)
    assert recorded["protocol"] == "messages" and recorded["upstream_model"] == "claude-fake-1"
    assert recorded["request"]["messages"][0]["content"] == "Hello there"
    assert recorded["prompt_tokens"] is not None and recorded["completion_tokens"] == 7

    with client.messages.stream(
        model="claude-fake", max_tokens=64, messages=[{"role": "user", "content": "Stream please"}]
    ) as stream:
        final = stream.get_final_message()
    assert final.content[0].text.strip() == "native messages: Stream please"
    streamed = _call(db, final.id)
    assert streamed["stream"] and streamed["response"]["content"][0]["text"].strip() == final.content[0].text.strip()

    tool = client.messages.create(
        model="claude-fake",
        max_tokens=64,
        tools=[WEATHER_TOOL],
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    )
    assert tool.stop_reason == "tool_use" and tool.content[0].input == {"city": "Paris"}
    assert client.messages.count_tokens(
        model="claude-fake", messages=[{"role": "user", "content": "a b c"}]
    ).input_tokens


def test_translated_for_a_policy_streamed_and_not(client, db):
    message = client.messages.create(
        model="agent",
        max_tokens=64,
        system="You are terse.",
        messages=[{"role": "user", "content": "Name a fruit."}],
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].text.startswith("Name a fruit.") and message.stop_reason == "end_turn"
    recorded = _call(db, message.id)
    assert recorded["protocol"] == "messages"
    assert recorded["request"]["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a fruit."},
    ]
    assert recorded["native_request"]["system"] == "You are terse."
    assert recorded["native_response"]["id"] == message.id

    with client.messages.stream(
        model="agent", max_tokens=64, messages=[{"role": "user", "content": "Count to three."}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text and final.usage.output_tokens > 0
    assert _call(db, final.id)["completion_tokens"]


def test_a_tool_use_run_is_one_trajectory(client, db):
    question = {"role": "user", "content": "What is the weather in Paris?"}
    first = client.messages.with_raw_response.create(
        model="agent", max_tokens=64, tools=[WEATHER_TOOL], messages=[question]
    )
    call = first.parse()
    tool_use = [block for block in call.content if block.type == "tool_use"]
    assert call.stop_reason == "tool_use" and len(tool_use) == 1
    second = client.messages.with_raw_response.create(
        model="agent",
        max_tokens=64,
        tools=[WEATHER_TOOL],
        messages=[
            question,
            {"role": "assistant", "content": [block.to_dict() for block in call.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": tool_use[0].id, "content": "18 C, sunny"}],
            },
        ],
    )
    assert second.headers["x-apprentice-trajectory-id"] == first.headers["x-apprentice-trajectory-id"]
    recorded = _call(db, second.parse().id)
    assert [m["role"] for m in recorded["request"]["messages"]] == ["user", "assistant", "tool"]
    assert recorded["trajectory_id"] == _call(db, call.id)["trajectory_id"]


def test_errors_come_in_anthropics_format(client, gateway):
    # The SDK refuses a missing max_tokens itself; a client without it reaches the gateway.
    missing = httpx.post(
        gateway.url + "/v1/messages",
        headers={"x-api-key": "k", "anthropic-version": "2023-06-01"},
        json={"model": "agent", "messages": [{"role": "user", "content": "x"}]},
    )
    assert missing.status_code == 400
    assert missing.json()["type"] == "error" and missing.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in missing.json()["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as unknown:
        client.messages.create(model="no-such-model", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert unknown.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(
            model="agent",
            max_tokens=5,
            tools=[{"type": "web_search_20250305", "name": "web_search"}],  # type: ignore[list-item]
            messages=[{"role": "user", "content": "x"}],
        )
    count = client.messages.count_tokens(model="agent", messages=[{"role": "user", "content": "one two three four"}])
    assert count.input_tokens > 0


@pytest.mark.parametrize("name", ["X-Trajectory-Id", "X-Group-Id", "X-Task-Family"])
@pytest.mark.parametrize("model", ["agent", "claude-fake"])  # translated for a policy; forwarded natively
def test_a_blank_name_header_is_a_400_naming_it_in_anthropics_format(client, name, model):
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(
            model=model, max_tokens=5, messages=[{"role": "user", "content": "x"}], extra_headers={name: ""}
        )
    assert refused.value.body["type"] == "error" and refused.value.body["error"]["type"] == "invalid_request_error"
    assert name in refused.value.body["error"]["message"]
