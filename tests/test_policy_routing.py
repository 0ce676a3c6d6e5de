"""A policy is served from a list of inference endpoints (vLLM or the local server)."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.conftest import wait_for


def test_policy_goes_to_a_live_endpoint_with_its_base_model(start_gateway, fake_upstream, db):
    policy = {
        "name": "support-agent",
        "base_model": "fake-base",
        "temperature": 0.9,
        "endpoints": ["http://127.0.0.1:9/v1", fake_upstream.api_base],
    }
    gateway = start_gateway(policies=[policy])
    client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
    assert "support-agent" in [m.id for m in client.models.list()]
    httpx.delete(f"http://127.0.0.1:{fake_upstream.port}/_requests")
    for _ in range(3):  # round-robin starts on the dead endpoint at least once
        completion = client.chat.completions.create(
            model="support-agent", temperature=0.0, messages=[{"role": "user", "content": "help"}]
        )
        assert completion.choices[0].message.content.startswith("help")
    forwarded = httpx.get(f"http://127.0.0.1:{fake_upstream.port}/_requests").json()["requests"]
    assert [b["model"] for b in forwarded] == ["fake-base"] * 3
    assert [b["temperature"] for b in forwarded] == [0.9] * 3, "the policy's sampling temperature is enforced"
    rows = wait_for(
        lambda: (
            (r := db.execute("SELECT policy, upstream, upstream_model, temperature FROM calls").fetchall())
            and len(r) == 3
            and r
        )
    )
    assert {r[0] for r in rows} == {"support-agent"} and {r[2] for r in rows} == {"fake-base"}
    assert {r[1] for r in rows} == {f"support-agent@{fake_upstream.api_base}"}
    assert {r[3] for r in rows} == {0.9}
    trajectory = db.execute("SELECT policy FROM trajectories").fetchall()
    assert {t[0] for t in trajectory} == {"support-agent"}


def test_policy_with_no_live_endpoint_fails_clearly(start_gateway, db):
    policy = {
        "name": "offline-agent",
        "base_model": "m",
        "endpoints": ["http://127.0.0.1:9/v1", "http://127.0.0.1:11/v1"],
    }
    gateway = start_gateway(policies=[policy])
    client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
    with pytest.raises(openai.APIStatusError) as failure:
        client.chat.completions.create(model="offline-agent", messages=[{"role": "user", "content": "x"}])
    assert failure.value.status_code == 502
    assert (
        "no upstream answered" in failure.value.message
        and "offline-agent@http://127.0.0.1:9/v1" in failure.value.message
    )
    row = wait_for(lambda: db.execute("SELECT status_code, error FROM calls").fetchone())
    assert row[0] == 502 and row[1]["error"]["code"] == "upstream_unavailable"


def test_policy_calls_record_token_ids_and_logprobs_the_client_did_not_ask_for(start_gateway, fake_upstream, db):
    policy = {"name": "learning-agent", "base_model": "fake-base", "endpoints": [fake_upstream.api_base]}
    gateway = start_gateway(policies=[policy])
    client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
    httpx.delete(f"http://127.0.0.1:{fake_upstream.port}/_requests")
    plain = client.chat.completions.with_raw_response.create(
        model="learning-agent", messages=[{"role": "user", "content": "plain"}]
    )
    answer = plain.http_response.json()
    assert answer["choices"][0]["logprobs"] is None and "token_ids" not in answer["choices"][0]
    assert "prompt_token_ids" not in answer
    stream = client.chat.completions.with_raw_response.create(
        model="learning-agent", messages=[{"role": "user", "content": "streamed"}], stream=True
    )
    events = [line for line in stream.http_response.iter_lines() if line.startswith("data: {")]
    assert events and all('"token_ids"' not in e and '"logprobs":{' not in e for e in events)
    asked = client.chat.completions.create(
        model="learning-agent", messages=[{"role": "user", "content": "mine"}], logprobs=True
    )
    assert asked.choices[0].logprobs is not None and len(asked.choices[0].logprobs.content) == 20
    forwarded = httpx.get(f"http://127.0.0.1:{fake_upstream.port}/_requests").json()["requests"]
    assert all(b["logprobs"] is True and b["return_token_ids"] is True for b in forwarded)
    rows = wait_for(
        lambda: (r := db.execute("SELECT response FROM calls ORDER BY created_at").fetchall()) and len(r) == 3 and r
    )
    for (response,) in rows:
        choice = response["choices"][0]
        assert len(choice["token_ids"]) == 20 and len(choice["logprobs"]["content"]) == 20
    assert rows[0][0]["prompt_token_ids"] == list(range(1, 11))
