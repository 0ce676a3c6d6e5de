"""POST /v1/responses with the official openai SDK: forwarded natively to an upstream that
speaks it, translated for a policy; recorded once each with its trajectory; errors in OpenAI's
format; GET /v1/responses/{id} answered from the record."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.conftest import wait_for

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def _policy(api_base: str) -> dict[str, Any]:
    return {"name": "agent", "base_model": "fake-model", "endpoints": [api_base], "record_tokens": False}


def _deployment(name: str, api_base: str, **entry: Any) -> dict[str, Any]:
    return {"model_name": name, "litellm_params": {"model": "openai/fake-model", "api_base": api_base}, **entry}


@pytest.fixture
def gateway(start_gateway, fake_upstream):
    model_list = [
        # The fake upstream serves /v1/responses: said explicitly, as for a vLLM that does.
        _deployment("fake-model", fake_upstream.api_base, protocols=["responses"]),
        # The same upstream as a server that speaks chat completions only, said nothing about.
        _deployment("chat-only", fake_upstream.chat_only_api_base),
        # One whose entry claims Responses wrongly: its calls are forwarded and refused.
        _deployment("chat-only-claimed", fake_upstream.chat_only_api_base, protocols=["responses"]),
    ]
    return start_gateway(policies=[_policy(fake_upstream.api_base)], model_list=model_list)


@pytest.fixture
def client(gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)


def _call(db, response_id: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        cursor = db.execute(
            "SELECT c.protocol, c.request, c.response, c.native_request, c.native_response, c.stream, "
            "c.trajectory_id::text AS trajectory_id, c.prompt_tokens, c.completion_tokens, c.policy "
            "FROM calls c WHERE c.response_id = %s",
            (response_id,),
        )
        rows = cursor.fetchall()
        if len(rows) != 1:
            return None
        return dict(zip([c.name for c in cursor.description], rows[0], strict=True))

    return wait_for(found, message=f"the call of {response_id} recorded once")


# ---- an upstream that speaks the Responses API: forwarded as it is ---------------------------
def test_forwarded_natively_streamed_and_not_and_chained(client, db):
    first = client.responses.with_raw_response.create(model="fake-model", input="Where is my parcel?")
    response = first.parse()
    assert response.output_text == "native responses: Where is my parcel?"
    recorded = _call(db, response.id)
    assert recorded["protocol"] == "responses" and recorded["request"]["input"] == "Where is my parcel?"
    assert recorded["response"]["id"] == response.id and recorded["native_request"] is None
    assert recorded["prompt_tokens"] is not None

    second = client.responses.with_raw_response.create(
        model="fake-model", input="And when will it arrive?", previous_response_id=response.id
    )
    assert second.parse().previous_response_id == response.id
    assert second.headers["x-apprentice-trajectory-id"] == first.headers["x-apprentice-trajectory-id"]
    assert _call(db, second.parse().id)["trajectory_id"] == recorded["trajectory_id"]

    events = list(client.responses.create(model="fake-model", input="stream it", stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    streamed = events[-1].response
    assert streamed.output_text == "native responses: stream it"
    assert _call(db, streamed.id)["response"]["output"][0]["content"][0]["text"] == streamed.output_text

    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="fake-model", input="x", previous_response_id="resp_unknown")
    assert refused.value.code == "previous_response_not_found"


# ---- an openai/ deployment on a server that speaks chat completions only ----------------------
def test_an_openai_deployment_elsewhere_than_openai_is_translated_and_a_refused_native_call_is_not_resent(
    client, fake_upstream, db
):
    upstream = httpx.Client(base_url=fake_upstream.api_base.removesuffix("/v1"))
    upstream.delete("/_requests")
    response = client.responses.create(model="chat-only", instructions="Be brief.", input="Where is my parcel?")
    assert response.status == "completed" and response.output_text.startswith("Where is my parcel?")
    recorded = _call(db, response.id)
    assert recorded["protocol"] == "responses" and recorded["native_request"]["instructions"] == "Be brief."
    assert recorded["request"]["messages"][-1] == {"role": "user", "content": "Where is my parcel?"}

    events = list(client.responses.create(model="chat-only", input="Stream it.", stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert text == events[-1].response.output_text and text.startswith("Stream it.")
    assert len(upstream.get("/_requests").json()["requests"]) == 2  # each call reached chat completions once

    # An entry that says it speaks Responses is believed: forwarded, refused, never resent translated.
    upstream.delete("/_requests")
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="chat-only-claimed", input="x")
    assert upstream.get("/_requests").json()["requests"] == []


# ---- a policy: translated to chat completions and back ---------------------------------------
def test_translated_for_a_policy_with_instructions_and_recorded_in_chat_form(client, db):
    response = client.responses.create(
        model="agent", instructions="Answer briefly.", input="Name a colour.", temperature=0.7
    )
    assert response.object == "response" and response.status == "completed"
    assert response.output_text.startswith("Name a colour.")  # the fake echoes the user's words
    assert response.usage is not None and response.usage.output_tokens > 0
    recorded = _call(db, response.id)
    assert recorded["protocol"] == "responses" and recorded["policy"] == "agent"
    assert recorded["request"]["messages"] == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Name a colour."},
    ]
    assert recorded["native_request"]["instructions"] == "Answer briefly."
    assert recorded["native_response"]["id"] == response.id
    assert client.responses.retrieve(response.id).output_text == response.output_text
    items = client.responses.input_items.list(response.id)
    assert [item.type for item in items.data] == ["message"]


def test_a_multi_turn_tool_run_chained_by_previous_response_id_is_one_trajectory(client, db):
    first = client.responses.with_raw_response.create(
        model="agent", input="What is the weather in Paris?", tools=[WEATHER_TOOL]
    )
    call = first.parse()
    function_calls = [item for item in call.output if item.type == "function_call"]
    assert len(function_calls) == 1 and function_calls[0].name == "get_weather"
    second = client.responses.with_raw_response.create(
        model="agent",
        previous_response_id=call.id,
        input=[{"type": "function_call_output", "call_id": function_calls[0].call_id, "output": "18 C, sunny"}],
    )
    answer = second.parse()
    assert answer.previous_response_id == call.id and answer.output_text
    assert second.headers["x-apprentice-trajectory-id"] == first.headers["x-apprentice-trajectory-id"]
    recorded = _call(db, answer.id)
    roles = [m["role"] for m in recorded["request"]["messages"]]
    assert roles == ["user", "assistant", "tool"]
    assert recorded["request"]["messages"][1]["tool_calls"][0]["id"] == function_calls[0].call_id
    assert recorded["trajectory_id"] == _call(db, call.id)["trajectory_id"]


def test_a_translated_stream_gives_the_sdk_its_events_and_is_recorded_with_usage(client, db):
    events = list(client.responses.create(model="agent", input="Stream a story.", stream=True))
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds
    final = events[-1].response
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert text == final.output_text and final.usage is not None
    recorded = _call(db, final.id)
    assert recorded["stream"] and recorded["completion_tokens"] and recorded["native_response"]["id"] == final.id

    with client.responses.stream(model="agent", input="Another one.") as stream:
        helper_final = stream.get_final_response()
    assert helper_final.output_text and _call(db, helper_final.id)["protocol"] == "responses"


def test_bad_requests_get_openai_errors(client, gateway):
    with pytest.raises(openai.BadRequestError) as bad_item:
        client.responses.create(model="agent", input=[{"type": "function_call_output", "output": "x"}])
    assert bad_item.value.body["param"].startswith("input[0]")
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="agent", input="x", tools=[{"type": "web_search"}])
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="no-such-model", input="x")
    with pytest.raises(openai.BadRequestError) as unknown:
        client.responses.create(model="agent", input="x", previous_response_id="resp_nobody")
    assert unknown.value.code == "previous_response_not_found"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_nobody")


@pytest.mark.parametrize("name", ["X-Trajectory-Id", "X-Group-Id", "X-Task-Family"])
@pytest.mark.parametrize("model", ["agent", "fake-model"])  # translated for a policy; forwarded natively
def test_a_blank_name_header_is_a_400_naming_it_in_openais_format(client, name, model):
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=model, input="x", extra_headers={name: ""})
    assert refused.value.body["param"] == name and name in refused.value.body["message"]
