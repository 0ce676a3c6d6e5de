"""The Responses API and Anthropic's Messages API against the real SmolLM2 policy (issue 13).

`apprentice serve-model` (the real SmolLM2-135M-Instruct) is a policy's endpoint behind a real
gateway. The official `openai` SDK calls `responses.create` (whole and streamed, a run chained by
`previous_response_id`), the official `anthropic` SDK calls `messages.create` (whole and
streamed). Each call must be recorded once, in both forms: the native request and answer the
client exchanged, and the chat form the learner trains on, with the exact token ids the policy's
endpoint returned (checked by replaying the recorded chat request at the endpoint with the same
seed, and against the tokenizer). The learner must read the translated calls as it reads chat
calls: `parse_call` gives exact ids and logprobs, selection takes the rewarded trajectories, and
the loss masks cover exactly the tokens the model sampled.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.conftest import count_rows, wait_for
from tests.support.learning import BASE

# The real SmolLM2 behind a gateway (make test-fast skips it).
pytestmark = pytest.mark.slow

POLICY = "agent"
MAX_TOKENS = 12
INSTRUCTIONS = "Answer in one short sentence."
# model_server: the session's SmolLM2 server (tests/learner/conftest.py), shared with the learning tests.


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture
def policy(model_server) -> dict[str, Any]:
    # No policy temperature: each call's own is used (and recorded), so that a replay is exact.
    return {"name": POLICY, "base_model": BASE, "endpoints": [model_server.api_base], "learning": {"reward_wait_s": 0}}


@pytest.fixture
def gateway(start_gateway, policy):
    return start_gateway(policies=[policy])


def recorded(db, response_id: str) -> dict[str, Any]:
    """The one calls row of a translated call, found by the id its client holds."""

    def found() -> dict[str, Any] | None:
        cursor = db.execute(
            "SELECT protocol, request, response, native_request, native_response, stream, status_code, policy, "
            "upstream_model, adapter_version_id, temperature, trajectory_id::text AS trajectory_id "
            "FROM calls WHERE response_id = %s",
            (response_id,),
        )
        rows = cursor.fetchall()
        assert len(rows) <= 1, f"{response_id} recorded {len(rows)} times"
        return dict(zip([c.name for c in cursor.description], rows[0], strict=True)) if rows else None

    return wait_for(found, timeout=30, message=f"the call of {response_id} recorded")


def assert_exact_tokens(row: dict[str, Any], model_server, tokenizer, client_text: str) -> None:
    """The chat form holds the token ids the endpoint returned, exactly, and nothing re-tokenized."""
    from learner.chat_template import render_chat_ids

    request, response = row["request"], row["response"]
    assert row["status_code"] == 200 and row["policy"] == POLICY and row["upstream_model"] == BASE
    assert request["model"] == POLICY and "return_token_ids" not in request, "the request as the client's, in chat form"
    assert response["object"] == "chat.completion" and len(response["choices"]) == 1
    prompt_ids, choice = response["prompt_token_ids"], response["choices"][0]
    completion_ids = choice["token_ids"]
    assert prompt_ids and completion_ids and len(completion_ids) <= MAX_TOKENS
    assert len(choice["logprobs"]["content"]) == len(completion_ids), "a logprob per sampled token"

    # the ids are the ones the endpoint answers this very chat request with (same seed, same settings)
    replay = {k: v for k, v in request.items() if k not in ("stream", "stream_options")}
    direct = httpx.post(
        f"{model_server.api_base}/chat/completions",
        json={**replay, "model": BASE, "logprobs": True, "return_token_ids": True},
        timeout=120,
    )
    assert direct.status_code == 200, direct.text
    again = direct.json()
    assert again["prompt_token_ids"] == prompt_ids
    assert again["choices"][0]["token_ids"] == completion_ids
    assert again["choices"][0]["message"]["content"] == choice["message"]["content"]
    for ours, theirs in zip(choice["logprobs"]["content"], again["choices"][0]["logprobs"]["content"], strict=True):
        assert ours["logprob"] == pytest.approx(theirs["logprob"], abs=1e-4)

    # and they are the recorded conversation rendered by the template, and the answer the client saw
    assert prompt_ids == render_chat_ids(tokenizer, request["messages"], add_generation_prompt=True)
    assert tokenizer.decode(completion_ids, skip_special_tokens=True) == choice["message"]["content"] == client_text


def assert_trainable(rows: list[dict[str, Any]]) -> None:
    """A trajectory's translated calls, read by the learner: exact ids, logprobs, masks over the answers."""
    from learner.grpo.tokens import parse_call, trajectory_segments

    calls = [
        parse_call(
            row["request"], row["response"], row["temperature"], None, following["request"] if following else None
        )
        for row, following in zip(rows, [*rows[1:], None], strict=True)
    ]
    for call, row in zip(calls, rows, strict=True):
        assert call.has_token_ids and call.logprobs is not None and len(call.logprobs) == len(call.completion_ids)
        assert call.prompt_ids == row["response"]["prompt_token_ids"]
        assert call.completion_ids == row["response"]["choices"][0]["token_ids"]
        assert call.messages == row["request"]["messages"]
    segments = trajectory_segments(None, calls)  # no tokenizer: the exact ids alone must suffice
    trained = [token for s in segments for token, on in zip(s.input_ids, s.loss_mask, strict=True) if on]
    assert trained == [token for call in calls for token in call.completion_ids], "the loss covers the answers only"
    for segment in segments:
        assert segment.behaviour_logprobs is not None
        assert all((lp == lp) == on for lp, on in zip(segment.behaviour_logprobs, segment.loss_mask, strict=True)), (
            "behaviour logprobs exactly on the sampled tokens"
        )


def trajectory_rows(db, trajectory_id: str) -> list[dict[str, Any]]:
    cursor = db.execute(
        "SELECT protocol, request, response, temperature FROM calls WHERE trajectory_id = %s::uuid "
        "ORDER BY created_at, id",
        (trajectory_id,),
    )
    return [dict(zip([c.name for c in cursor.description], row, strict=True)) for row in cursor.fetchall()]


def reward_and_select(gateway, db, policy: dict[str, Any], rewards: dict[str, float]) -> Any:
    """Post rewards for the trajectories and read them as a learner run would."""
    from apprentice.settings import PolicySettings
    from learner.jobs.selection import select

    for trajectory_id, value in rewards.items():
        answer = httpx.post(
            f"{gateway.base_url}/rewards", json={"trajectory_id": trajectory_id, "reward": value}, timeout=30
        )
        assert answer.status_code == 200, answer.text
    wait_for(
        lambda: (
            count_rows(
                db,
                "SELECT count(*) FROM rewards WHERE trajectory_id = ANY(%s::uuid[]) AND status = 'linked'",
                list(rewards),
            )
            == len(rewards)
        ),
        timeout=30,
        message="rewards linked",
    )
    selection = select(db, PolicySettings.model_validate(policy))
    assert selection.skipped == {} and selection.stale == {}, (selection.skipped, selection.stale)
    assert set(selection.candidates) == set(rewards)
    return selection


def test_responses_api_calls_on_the_local_policy_are_recorded_with_exact_tokens_and_train(
    gateway, policy, model_server, tokenizer, db
):
    client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=120)
    settings = {"model": POLICY, "instructions": INSTRUCTIONS, "max_output_tokens": MAX_TOKENS, "temperature": 1.0}

    # 1. a whole answer; instructions apply to one call only, so an agent sends them with every call
    first = client.responses.with_raw_response.create(input="Name a colour.", extra_body={"seed": 1}, **settings)
    one = first.parse()
    assert one.status in ("completed", "incomplete") and one.output_text
    assert one.usage is not None and 0 < one.usage.output_tokens <= MAX_TOKENS

    # 2. streamed, continuing the first by previous_response_id
    second = client.responses.with_raw_response.create(
        input="Name another one.", previous_response_id=one.id, stream=True, extra_body={"seed": 2}, **settings
    )
    events = list(second.parse())
    assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")
    two = events[-1].response
    streamed_text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert two.previous_response_id == one.id and streamed_text == two.output_text and two.output_text

    # 3. whole again, continuing the streamed one
    third = client.responses.with_raw_response.create(
        input="And a third?", previous_response_id=two.id, extra_body={"seed": 3}, **settings
    )
    three = third.parse()
    assert three.previous_response_id == two.id and three.output_text

    trajectory = first.headers["x-trajectory-id"]
    assert second.headers["x-trajectory-id"] == trajectory == third.headers["x-trajectory-id"]

    rows = [recorded(db, r.id) for r in (one, two, three)]
    for row, response, stream in zip(rows, (one, two, three), (False, True, False), strict=True):
        assert row["protocol"] == "responses" and row["stream"] is stream
        assert row["trajectory_id"] == trajectory, "the chained calls share one trajectory"
        assert row["native_request"]["model"] == POLICY and row["native_request"]["max_output_tokens"] == MAX_TOKENS
        assert row["native_response"]["id"] == response.id
        assert row["native_response"]["output"][0]["content"][0]["text"] == response.output_text
        assert_exact_tokens(row, model_server, tokenizer, response.output_text)
    assert all(row["native_request"]["instructions"] == INSTRUCTIONS for row in rows)
    assert rows[1]["native_request"]["previous_response_id"] == one.id and rows[1]["native_request"]["seed"] == 2

    # previous_response_id expanded to the conversation, in chat form: the learner reads one run
    def content(row: dict[str, Any]) -> str:
        return row["response"]["choices"][0]["message"]["content"]

    assert rows[0]["request"]["messages"] == [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": "Name a colour."},
    ]
    assert rows[1]["request"]["messages"] == [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": content(rows[0])},
        {"role": "user", "content": "Name another one."},
    ]
    assert rows[2]["request"]["messages"] == [
        *rows[1]["request"]["messages"],
        {"role": "assistant", "content": content(rows[1])},
        {"role": "user", "content": "And a third?"},
    ]

    # recorded once each, one trajectory of three calls
    wait_for(lambda: count_rows(db, "SELECT count(*) FROM calls") == 3, timeout=10, message="three calls")
    assert db.execute(
        "SELECT count(*), sum(call_count) FROM trajectories WHERE policy = %s AND merged_into IS NULL", (POLICY,)
    ).fetchone() == (1, 3)

    # the learner reads the run as it reads chat calls
    ordered = trajectory_rows(db, trajectory)
    assert [r["protocol"] for r in ordered] == ["responses"] * 3
    assert_trainable(ordered)
    internal = first.headers["x-apprentice-trajectory-id"]
    selection = reward_and_select(gateway, db, policy, {internal: 1.0})
    candidate = selection.candidates[internal]
    assert candidate.member.reward == 1.0 and len(candidate.calls) == 3
    assert [c.completion_ids for c in candidate.calls] == [r["response"]["choices"][0]["token_ids"] for r in rows]


def test_messages_api_calls_on_the_local_policy_are_recorded_with_exact_tokens_and_train(
    gateway, policy, model_server, tokenizer, db
):
    client = anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0, timeout=120)
    # Messages has no seed: greedy sampling makes the replay exact (this SDK's signature no longer
    # names temperature; the API and the gateway still take it)
    settings = {"model": POLICY, "max_tokens": MAX_TOKENS, "extra_body": {"temperature": 0.0}}
    question = {"role": "user", "content": "Name a fruit."}

    whole = client.messages.with_raw_response.create(system="You are terse.", messages=[question], **settings)
    message = whole.parse()
    assert message.type == "message" and message.role == "assistant"
    assert message.stop_reason in ("end_turn", "max_tokens") and message.content[0].type == "text"
    text = message.content[0].text
    assert 0 < message.usage.output_tokens <= MAX_TOKENS

    # streamed: a second turn of the same run, the history sent again as Anthropic clients do
    follow_up = {"role": "user", "content": "Name a vegetable."}
    streamed = client.messages.with_raw_response.create(
        system="You are terse.",
        messages=[question, {"role": "assistant", "content": [b.to_dict() for b in message.content]}, follow_up],
        stream=True,
        **settings,
    )
    events = list(streamed.parse())
    assert events[0].type == "message_start" and events[-1].type == "message_stop"
    streamed_id = events[0].message.id
    streamed_text = "".join(
        e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"
    )
    assert streamed_text
    assert [e.delta.stop_reason for e in events if e.type == "message_delta"][0] in ("end_turn", "max_tokens")

    rows = [recorded(db, message.id), recorded(db, streamed_id)]
    for row, stream in zip(rows, (False, True), strict=True):
        assert row["protocol"] == "messages" and row["stream"] is stream
        assert row["native_request"]["model"] == POLICY and row["native_request"]["system"] == "You are terse."
    assert rows[0]["native_response"]["id"] == message.id
    assert rows[0]["native_response"]["content"][0]["text"] == text
    assert rows[1]["native_response"]["id"] == streamed_id
    assert rows[1]["native_response"]["content"][0]["text"] == streamed_text
    assert_exact_tokens(rows[0], model_server, tokenizer, text)
    assert_exact_tokens(rows[1], model_server, tokenizer, streamed_text)
    assert rows[1]["request"]["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a fruit."},
        {"role": "assistant", "content": text},
        {"role": "user", "content": "Name a vegetable."},
    ]

    # the second turn continues the first's trajectory (stitched by the echoed history)
    trajectory = whole.headers["x-trajectory-id"]
    assert streamed.headers["x-trajectory-id"] == trajectory
    assert rows[0]["trajectory_id"] == rows[1]["trajectory_id"] == trajectory
    wait_for(lambda: count_rows(db, "SELECT count(*) FROM calls") == 2, timeout=10, message="two calls")

    ordered = trajectory_rows(db, trajectory)
    assert [r["protocol"] for r in ordered] == ["messages"] * 2
    assert_trainable(ordered)

    # a second, separate run: a group of two that selection reads with exact ids
    other = client.messages.with_raw_response.create(messages=[{"role": "user", "content": "Name a tree."}], **settings)
    other_row = recorded(db, other.parse().id)
    assert other_row["trajectory_id"] != trajectory
    selection = reward_and_select(gateway, db, policy, {trajectory: 1.0, other_row["trajectory_id"]: 0.0})
    assert all(c.calls and all(call.has_token_ids for call in c.calls) for c in selection.candidates.values())
    assert len(selection.candidates[trajectory].calls) == 2


def test_a_run_chained_by_previous_response_id_stays_one_trajectory_when_instructions_change(gateway, db):
    """OpenAI applies `instructions` to one call only: an agent may send them on its first call
    and not again (or change them), and `previous_response_id` still names the same run. The
    chained call must continue the trajectory of the response it names, whatever its instructions."""
    client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=120)
    settings = {"model": POLICY, "max_output_tokens": 4, "temperature": 1.0}
    first = client.responses.with_raw_response.create(
        instructions=INSTRUCTIONS, input="Name a colour.", extra_body={"seed": 1}, **settings
    )
    second = client.responses.with_raw_response.create(
        input="Name another one.", previous_response_id=first.parse().id, extra_body={"seed": 2}, **settings
    )
    third = client.responses.with_raw_response.create(
        instructions="Now answer in French.",
        input="And a third?",
        previous_response_id=second.parse().id,
        extra_body={"seed": 3},
        **settings,
    )
    rows = [recorded(db, r.parse().id) for r in (first, second, third)]
    # the conversation is expanded (each call's own instructions only, as OpenAI does) ...
    assert rows[1]["request"]["messages"][0] == {"role": "user", "content": "Name a colour."}
    assert rows[2]["request"]["messages"][0] == {"role": "system", "content": "Now answer in French."}
    # ... and the run is one trajectory, as previous_response_id says
    trajectories = [r.headers["x-trajectory-id"] for r in (first, second, third)]
    assert trajectories[1] == trajectories[0] and trajectories[2] == trajectories[0], trajectories
    assert {row["trajectory_id"] for row in rows} == {trajectories[0]}
