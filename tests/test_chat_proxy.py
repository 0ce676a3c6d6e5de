"""The gateway as a drop-in OpenAI endpoint: official clients, real HTTP, real PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import openai
import pytest

from tests.conftest import count_rows, wait_for

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def stored_call(db, call_id: str) -> dict:
    row = wait_for(
        lambda: db.execute(
            "SELECT request, response, status_code, stream, trajectory_id::text, response_id, prompt_tokens, "
            "completion_tokens, latency_ms, ttft_ms, error, upstream, tenant FROM calls WHERE id = %s",
            (call_id,),
        ).fetchone(),
        message=f"call {call_id} in PostgreSQL",
    )
    keys = [
        "request",
        "response",
        "status_code",
        "stream",
        "trajectory_id",
        "response_id",
        "prompt_tokens",
        "completion_tokens",
        "latency_ms",
        "ttft_ms",
        "error",
        "upstream",
        "tenant",
    ]
    return dict(zip(keys, row, strict=True))


@pytest.fixture
def gateway(start_gateway):
    return start_gateway()


@pytest.fixture
def client(gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key="unused-in-open-mode", max_retries=0)


def test_plain_call_is_forwarded_and_recorded(client, db):
    raw = client.chat.completions.with_raw_response.create(
        model="fake-model",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}],
        temperature=0.7,
        seed=3,
        max_completion_tokens=50,
        stop=["\n\n"],
    )
    completion = raw.parse()
    assert completion.choices[0].message.content.startswith("hello there")
    call_id, trajectory_id = raw.headers["x-apprentice-call-id"], raw.headers["x-trajectory-id"]
    row = stored_call(db, call_id)
    assert row["status_code"] == 200 and row["stream"] is False
    assert row["trajectory_id"] == trajectory_id
    assert row["response_id"] == completion.id
    assert row["request"]["messages"][1] == {"role": "user", "content": "hello there"}
    assert row["request"]["seed"] == 3 and row["request"]["stop"] == ["\n\n"]
    assert row["response"]["choices"][0]["message"]["content"] == completion.choices[0].message.content
    assert row["prompt_tokens"] == completion.usage.prompt_tokens
    assert row["completion_tokens"] == completion.usage.completion_tokens
    assert row["latency_ms"] > 0 and row["tenant"] == "local" and row["upstream"] == "fake-model"
    # The response id the client holds is enough to find the call and its trajectory.
    found = db.execute("SELECT trajectory_id::text FROM calls WHERE response_id = %s", (completion.id,)).fetchone()
    assert found == (trajectory_id,)
    wait_for(
        lambda: count_rows(db, "SELECT count(*) FROM trajectories WHERE id = %s AND call_count = 1", trajectory_id)
    )


def test_stream_is_passed_through_and_assembled(client, db, fake_upstream):
    raw = client.chat.completions.with_raw_response.create(
        model="fake-model",
        messages=[{"role": "user", "content": "stream please"}],
        stream=True,
        stream_options={"include_usage": True},
        logprobs=True,
        top_logprobs=2,
    )
    chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("stream please") and len(text.split()) == 20
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    row = stored_call(db, raw.headers["x-apprentice-call-id"])
    assert row["stream"] is True
    assert row["response"]["choices"][0]["message"]["content"] == text
    assert row["response"]["choices"][0]["finish_reason"] == "stop"
    assert len(row["response"]["choices"][0]["logprobs"]["content"]) == 20
    assert row["response"]["usage"]["completion_tokens"] == chunks[-1].usage.completion_tokens
    assert row["completion_tokens"] == 20
    assert row["ttft_ms"] is not None and row["ttft_ms"] <= row["latency_ms"]


def test_tools_plain_and_streamed(client, db):
    plain = client.chat.completions.with_raw_response.create(
        model="fake-model", messages=[{"role": "user", "content": "weather?"}], tools=TOOLS, tool_choice="auto"
    )
    call = plain.parse().choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["query"] == "weather"
    row = stored_call(db, plain.headers["x-apprentice-call-id"])
    assert row["request"]["tools"] == TOOLS and row["request"]["tool_choice"] == "auto"
    assert row["response"]["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"

    streamed = client.chat.completions.with_raw_response.create(
        model="fake-model", messages=[{"role": "user", "content": "weather?"}], tools=TOOLS, stream=True
    )
    deltas = [c.choices[0].delta.tool_calls for c in streamed.parse() if c.choices and c.choices[0].delta.tool_calls]
    arguments = "".join(d[0].function.arguments or "" for d in deltas)
    assert json.loads(arguments) == {"query": "weather", "n": 0}
    row = stored_call(db, streamed.headers["x-apprentice-call-id"])
    stored_tool_call = row["response"]["choices"][0]["message"]["tool_calls"][0]
    assert stored_tool_call["function"] == {"name": "get_weather", "arguments": arguments}
    assert stored_tool_call["id"] == deltas[0][0].id
    assert row["response"]["choices"][0]["finish_reason"] == "tool_calls"


def test_n_choices_and_unknown_fields_pass_through(client, db, fake_upstream):
    marker = uuid.uuid4().hex
    raw = client.chat.completions.with_raw_response.create(
        model="fake-model",
        messages=[{"role": "user", "content": "two please"}],
        n=2,
        response_format={"type": "json_object"},
        extra_body={"x_vendor_field": marker, "return_token_ids": True},
    )
    completion = raw.parse()
    assert [c.index for c in completion.choices] == [0, 1]
    seen = httpx.get(f"http://127.0.0.1:{fake_upstream.port}/_requests").json()
    forwarded = [body for body in seen["requests"] if body.get("x_vendor_field") == marker]
    assert len(forwarded) == 1
    assert forwarded[0]["n"] == 2 and forwarded[0]["response_format"] == {"type": "json_object"}
    row = stored_call(db, raw.headers["x-apprentice-call-id"])
    assert len(row["response"]["choices"]) == 2
    assert row["response"]["choices"][0]["token_ids"] and row["response"]["prompt_token_ids"]
    # The upstream's key is sent upstream, never stored, and the client's key is not forwarded.
    headers = [
        h for body, h in zip(seen["requests"], seen["headers"], strict=True) if body.get("x_vendor_field") == marker
    ][0]
    assert headers["authorization"] == "Bearer sk-upstream-secret"
    assert "sk-upstream-secret" not in json.dumps(row, default=str)


def test_upstream_errors_keep_status_and_are_recorded(start_gateway, fake_upstream, db):
    failing = [
        {
            "model_name": f"broken-{status}",
            "litellm_params": {"model": f"openai/fail-{status}", "api_base": fake_upstream.api_base},
        }
        for status in (500, 429, 400)
    ]
    gateway = start_gateway(model_list=failing)
    client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
    with pytest.raises(openai.InternalServerError) as failure:
        client.chat.completions.create(model="broken-500", messages=[{"role": "user", "content": "x"}])
    assert failure.value.status_code == 500
    assert "fake upstream failure 500" in failure.value.message
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="broken-429", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="broken-400", stream=True, messages=[{"role": "user", "content": "x"}])
    rows = wait_for(
        lambda: (
            db.execute("SELECT status_code, error FROM calls ORDER BY created_at").fetchall()
            if count_rows(db, "SELECT count(*) FROM calls") == 3
            else None
        ),
        message="three error calls",
    )
    assert [r[0] for r in rows] == [500, 429, 400]
    assert rows[0][1]["error"]["message"] == "fake upstream failure 500"


def test_retries_and_fallbacks_before_first_byte(start_gateway, fake_upstream, db):
    entries = [
        {"model_name": "primary", "litellm_params": {"model": "openai/fail-503", "api_base": fake_upstream.api_base}},
        {"model_name": "backup", "litellm_params": {"model": "openai/fake-model", "api_base": fake_upstream.api_base}},
        {"model_name": "dead", "litellm_params": {"model": "openai/fake-model", "api_base": "http://127.0.0.1:9/v1"}},
    ]
    gateway = start_gateway(
        model_list=entries, router_settings={"num_retries": 1, "fallbacks": [{"primary": ["backup"]}]}
    )
    client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
    completion = client.chat.completions.create(model="primary", messages=[{"role": "user", "content": "fall back"}])
    assert completion.choices[0].message.content.startswith("fall back")
    with pytest.raises(openai.APIStatusError) as unreachable:
        client.chat.completions.create(model="dead", messages=[{"role": "user", "content": "x"}])
    assert unreachable.value.status_code == 502 and "no upstream answered" in unreachable.value.message
    rows = wait_for(
        lambda: (
            db.execute("SELECT model, upstream, status_code FROM calls ORDER BY created_at").fetchall()
            if count_rows(db, "SELECT count(*) FROM calls") == 2
            else None
        ),
        message="two calls",
    )
    assert rows == [("primary", "backup", 200), ("dead", None, 502)]


def test_gateway_errors_in_openai_format(gateway, client, db):
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    assert unknown.value.code == "model_not_found" and "no-such-model" in unknown.value.message
    with pytest.raises(openai.BadRequestError) as missing:
        client.chat.completions.create(model="fake-model", messages=[])
    assert missing.value.param == "messages"
    bad_json = httpx.post(
        gateway.base_url + "/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert bad_json.status_code == 400 and bad_json.json()["error"]["code"] == "invalid_json"
    no_model = httpx.post(gateway.base_url + "/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    assert no_model.status_code == 400 and no_model.json()["error"]["param"] == "model"
    bad_stream = httpx.post(
        gateway.base_url + "/chat/completions",
        json={"model": "fake-model", "stream": "yes", "messages": [{"role": "user", "content": "x"}]},
    )
    assert bad_stream.status_code == 400 and bad_stream.json()["error"]["param"] == "stream"
    unknown_path = httpx.get(gateway.url + "/nope")
    assert unknown_path.status_code == 404 and "error" in unknown_path.json()
    assert count_rows(db, "SELECT count(*) FROM calls") == 0


def test_body_limit(start_gateway, db):
    gateway = start_gateway(limits={"max_body_bytes": 2048})
    client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
    with pytest.raises(openai.APIStatusError) as too_large:
        client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x" * 5000}])
    assert too_large.value.status_code == 413
    assert "limit" in too_large.value.message


def test_other_endpoints_are_forwarded(client, gateway):
    embedding = client.embeddings.create(model="fake-model", input=["a", "b"])
    assert len(embedding.data) == 2 and embedding.data[1].embedding[0] == pytest.approx(0.2)
    assert [m.id for m in client.models.list()] == ["fake-model"]


async def test_async_client_concurrent_calls(gateway, db):
    client = openai.AsyncOpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)

    async def one(i: int) -> str:
        if i % 2:
            stream = await client.chat.completions.create(
                model="fake-model", stream=True, messages=[{"role": "user", "content": f"async {i}"}]
            )
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        completion = await client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": f"async {i}"}]
        )
        return completion.choices[0].message.content

    texts = await asyncio.gather(*(one(i) for i in range(40)))
    assert all(text.startswith(f"async {i}") for i, text in enumerate(texts))
    await client.close()
    wait_for(lambda: count_rows(db, "SELECT count(*) FROM calls") == 40, message="40 calls")
    assert count_rows(db, "SELECT count(DISTINCT id) FROM calls") == 40
    assert count_rows(db, "SELECT count(*) FROM calls WHERE stream") == 20


def test_litellm_path(start_gateway, fake_upstream, db):
    """Providers that are not OpenAI-compatible go through litellm (forced here on the fake)."""
    entry = {
        "model_name": "via-litellm",
        "forward": "litellm",
        "litellm_params": {"model": "openai/fake-model", "api_base": fake_upstream.api_base, "api_key": "sk-x"},
    }
    gateway = start_gateway(model_list=[entry])
    client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
    completion = client.chat.completions.create(model="via-litellm", messages=[{"role": "user", "content": "lite"}])
    assert completion.choices[0].message.content.startswith("lite")
    stream = client.chat.completions.create(
        model="via-litellm", stream=True, messages=[{"role": "user", "content": "lite stream"}]
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text.startswith("lite stream")
    wait_for(
        lambda: count_rows(db, "SELECT count(*) FROM calls WHERE model = 'via-litellm' AND status_code = 200") == 2
    )


def test_body_limit_applies_to_rewards_even_when_chunked(start_gateway):
    gateway = start_gateway(limits={"max_body_bytes": 4096})

    def chunks():
        yield b'{"trajectory_id": "x", "comment": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'", "reward": 1}'

    chunked = httpx.post(gateway.base_url + "/rewards", content=chunks(), headers={"content-type": "application/json"})
    assert chunked.status_code == 413 and chunked.json()["error"]["code"] == "request_too_large"
    declared = httpx.post(
        gateway.base_url + "/rewards", content=b"{" + b" " * 5000 + b"}", headers={"content-type": "application/json"}
    )
    assert declared.status_code == 413


def test_litellm_path_applies_the_policys_temperature(start_gateway, fake_upstream, db):
    """A policy served through litellm gets the temperature the policy enforces, as recorded."""
    entry = {
        "model_name": "lite-agent",
        "forward": "litellm",
        "litellm_params": {"model": "openai/fake-model", "api_base": fake_upstream.api_base, "api_key": "sk-x"},
    }
    policy = {"name": "lite-agent", "base_model": "fake-model", "temperature": 0.3}
    gateway = start_gateway(model_list=[entry], policies=[policy])
    client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
    httpx.delete(f"http://127.0.0.1:{fake_upstream.port}/_requests")
    client.chat.completions.create(model="lite-agent", temperature=1.5, messages=[{"role": "user", "content": "t"}])
    stream = client.chat.completions.create(
        model="lite-agent", temperature=1.5, stream=True, messages=[{"role": "user", "content": "t stream"}]
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices).startswith("t stream")
    forwarded = httpx.get(f"http://127.0.0.1:{fake_upstream.port}/_requests").json()["requests"]
    assert [body["temperature"] for body in forwarded] == [0.3, 0.3]
    rows = wait_for(
        lambda: (
            (r := db.execute("SELECT temperature FROM calls WHERE policy = 'lite-agent'").fetchall())
            and len(r) == 2
            and r
        )
    )
    assert {row[0] for row in rows} == {0.3}
