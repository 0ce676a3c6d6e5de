"""Redaction of what is stored: real gateway, real PostgreSQL, the official clients.

E-mail addresses, phone numbers, keys and card numbers in prompts, answers, tool calls and tool
results are stored as placeholders (`<EMAIL_3f9a2c>`): in `calls` (request, response and the
native columns) and in the journal on disk. The same value is the same placeholder within a
trajectory, not across trajectories; the client still receives the original answer.

The fake upstream's answer begins with the first 40 characters of the last user message, so a
value put there comes back in the answer too.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from pydantic import ValidationError

from apprentice.settings import RedactionSettings, Settings
from gateway.redaction.redactor import Redaction
from gateway.redaction.rules import compile_rules, luhn_valid
from tests.conftest import wait_for

EMAIL = "Bob@Example.com"
PHONE = "+1 415-555-0132"
KEY = "sk-proj-Abc123def456ghi789jkl012mno345"
CARD = "4111 1111 1111 1111"  # a test Visa number: passes the Luhn check
VALUES = (EMAIL, PHONE, KEY, CARD)
PLACEHOLDER = re.compile(r"<(EMAIL|PHONE|SECRET|CARD|TICKET)_[0-9a-f]{6}>")


def stored_calls(db, trajectory_id: str, count: int = 1) -> list[dict[str, Any]]:
    """The trajectory's calls as stored (every column), once `count` of them have landed."""

    def rows() -> list[dict[str, Any]] | None:
        cursor = db.execute(
            "SELECT c.*, c.id::text AS call_id FROM calls c WHERE c.trajectory_id = %s::uuid ORDER BY c.created_at",
            (trajectory_id,),
        )
        names = [column.name for column in cursor.description]
        found = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        return found if len(found) >= count else None

    return wait_for(rows, message=f"{count} calls of trajectory {trajectory_id}")


def placeholders(value: Any) -> list[str]:
    return [match.group(0) for match in PLACEHOLDER.finditer(str(value))]


def assert_clean(row: dict[str, Any], *values: str) -> None:
    """No column of the stored call holds any of the values (nor their digits, for numbers)."""
    text = str(row)
    for value in values:
        assert value not in text, f"{value!r} stored in clear"
        assert value.lower() not in text.lower()
    assert "41111111" not in text.replace(" ", "")


def journal_text(data_dir: Path) -> str:
    return "".join(path.read_text() for path in (data_dir / "journal").glob("*.jsonl"))


@pytest.fixture
def gateway(start_gateway, tmp_path, fake_upstream):
    # The fake upstream serves /v1/responses too: said so, its Responses calls are forwarded natively.
    fake_model = {
        "model_name": "fake-model",
        "litellm_params": {"model": "openai/fake-model", "api_base": fake_upstream.api_base},
        "protocols": ["responses"],
    }
    return start_gateway(
        data_dir=tmp_path / "data",
        redaction={"rules": [{"name": "ticket", "pattern": r"TICKET-(\d{4,})"}]},
        model_list=[fake_model],
    )


@pytest.fixture
def client(gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key="unused-in-open-mode", max_retries=0)


# ---------------------------------------------------------------- the rules themselves


@pytest.mark.parametrize(
    ("text", "label"),
    [
        ("write to bob@example.com today", "EMAIL"),
        ("call +44 20 7946 0958 now", "PHONE"),
        ("call (415) 555-0132 now", "PHONE"),
        ("ring 06 12 34 56 78 please", "PHONE"),
        ("card 5500-0000-0000-0004 expires", "CARD"),
        ("key sk-ant-api03-abcdefghijklmnopqrstuvwxyz here", "SECRET"),
        ("Authorization: Bearer abcdefghijklmnopqrstuvwx.yz0123", "SECRET"),
        ("id AKIAIOSFODNN7EXAMPLE done", "SECRET"),
        ("token ghp_abcdefghijklmnopqrstuvwxyz0123456789 done", "SECRET"),
        ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "SECRET"),
        ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\n-----END OPENSSH PRIVATE KEY-----", "SECRET"),
    ],
)
def test_each_built_in_kind_is_found(text: str, label: str) -> None:
    redacted = Redaction(compile_rules(RedactionSettings()), b"k" * 32).text(text)
    assert re.search(rf"<{label}_[0-9a-f]{{6}}>", redacted), redacted


@pytest.mark.parametrize(
    "text",
    [
        "on 2026-12-01 and 01-02-2026 at 12:30",
        "version 1.2.3 costs 3.14159 and 1,299.99 dollars",
        "order 1234567890123456 of 12 items",  # 16 digits that fail the Luhn check
        "the sky-is-blue task-based approach, 8 words at most",
        "a Bearer token is described here",
    ],
)
def test_ordinary_text_and_numbers_are_left_alone(text: str) -> None:
    assert Redaction(compile_rules(RedactionSettings()), b"k" * 32).text(text) == text


def test_luhn() -> None:
    assert luhn_valid("4111111111111111") and luhn_valid("5500000000000004")
    assert not luhn_valid("4111111111111112") and not luhn_valid("1234567890123456")


def test_a_bad_custom_rule_is_a_config_error_at_start_up(tmp_path) -> None:
    with pytest.raises(ValidationError, match="not a valid regular expression"):
        Settings(redaction={"rules": [{"name": "broken", "pattern": "TICKET-(\\d+"}]})
    with pytest.raises(ValidationError, match="empty string"):
        Settings(redaction={"rules": [{"name": "empty", "pattern": "x*"}]})
    with pytest.raises(ValidationError):
        Settings(policies=[{"name": "p", "base_model": "b", "endpoints": ["http://x/v1"], "redaction": {"emails": 1}}])


def test_the_gateway_refuses_to_start_on_a_bad_rule(start_gateway) -> None:
    with pytest.raises(RuntimeError, match="not a valid regular expression"):
        start_gateway(redaction={"rules": [{"name": "broken", "pattern": "(unclosed"}]})


# ---------------------------------------------------------------- through the gateway


def test_values_in_prompt_and_answer_are_stored_as_placeholders(client, db, tmp_path) -> None:
    prompt = f"{EMAIL} {CARD} x"  # both within the 40 characters the fake answer echoes
    raw = client.chat.completions.with_raw_response.create(
        model="fake-model",
        messages=[
            {"role": "system", "content": f"Support agent. Escalate to {PHONE}; our key is {KEY}."},
            {"role": "user", "content": prompt},
        ],
    )
    answer = raw.parse().choices[0].message.content
    assert answer.startswith(f"{EMAIL} 4111 1111"), answer  # the client sees the original answer
    [row] = stored_calls(db, raw.headers["x-apprentice-trajectory-id"])
    assert_clean(row, *VALUES)
    system, user = row["request"]["messages"]
    assert re.fullmatch(r"Support agent\. Escalate to <PHONE_\w{6}>; our key is <SECRET_\w{6}>\.", system["content"])
    assert re.fullmatch(r"<EMAIL_\w{6}> <CARD_\w{6}> x", user["content"])
    stored_answer = row["response"]["choices"][0]["message"]["content"]
    email, card = user["content"].split()[:2]
    assert stored_answer.startswith(f"{email} {card} x ")  # same values, same placeholders as in the prompt
    assert row["response"]["usage"] and row["status_code"] == 200
    assert_clean({"journal": journal_text(tmp_path / "data")}, *VALUES)
    assert email in journal_text(tmp_path / "data")


def test_the_same_value_is_the_same_placeholder_within_a_trajectory_only(client, db) -> None:
    def call(run: str, text: str) -> str:
        raw = client.chat.completions.with_raw_response.create(
            model="fake-model", messages=[{"role": "user", "content": text}], extra_headers={"X-Trajectory-Id": run}
        )
        return raw.headers["x-apprentice-trajectory-id"]

    first = call("run-a", f"mail {EMAIL}")
    assert call("run-a", f"again {EMAIL.upper()} and bob@other.org") == first
    other = call("run-b", f"mail {EMAIL}")
    calls = stored_calls(db, first, 2)
    a1 = placeholders(calls[0]["request"])
    a2 = placeholders(calls[1]["request"])
    assert len(a1) == 1 and len(a2) == 2
    assert a2[0] == a1[0]  # the same address (case aside) in a later call of the run
    assert a2[1] != a1[0]  # a second address: another placeholder
    [b] = [placeholders(row["request"]) for row in stored_calls(db, other)]
    assert b[0].startswith("<EMAIL_") and b[0] != a1[0]  # another run: not linkable


def test_a_stream_is_recorded_redacted_and_reaches_the_client_whole(client, db) -> None:
    stream = client.chat.completions.with_raw_response.create(
        model="fake-model", messages=[{"role": "user", "content": f"{EMAIL} streamed"}], stream=True
    )
    trajectory = stream.headers["x-apprentice-trajectory-id"]
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream.parse() if chunk.choices)
    assert text.startswith(f"{EMAIL} streamed")
    [row] = stored_calls(db, trajectory)
    assert row["stream"] is True
    assert_clean(row, EMAIL)
    assert re.match(r"<EMAIL_\w{6}> streamed", row["response"]["choices"][0]["message"]["content"])


def test_tool_call_arguments_and_tool_results_are_redacted(client, db) -> None:
    messages = [
        {"role": "user", "content": "Find the customer"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": f'{{"email": "{EMAIL}"}}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": f'{{"phone": "{PHONE}", "card": "{CARD}"}}'},
    ]
    raw = client.chat.completions.with_raw_response.create(model="fake-model", messages=messages)
    [row] = stored_calls(db, raw.headers["x-apprentice-trajectory-id"])
    assert_clean(row, EMAIL, PHONE, CARD)
    stored = row["request"]["messages"]
    assert re.fullmatch(r'\{"email": "<EMAIL_\w{6}>"\}', stored[1]["tool_calls"][0]["function"]["arguments"])
    assert re.fullmatch(r'\{"phone": "<PHONE_\w{6}>", "card": "<CARD_\w{6}>"\}', stored[2]["content"])
    assert stored[1]["tool_calls"][0]["id"] == "call_1" and stored[0]["content"] == "Find the customer"


def test_a_custom_rule_replaces_its_group(client, db) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="fake-model", messages=[{"role": "user", "content": "see TICKET-123456 and TICKET-12"}]
    )
    [row] = stored_calls(db, raw.headers["x-apprentice-trajectory-id"])
    content = row["request"]["messages"][0]["content"]
    assert re.fullmatch(r"see TICKET-<TICKET_\w{6}> and TICKET-12", content), content
    assert "123456" not in str(row)


def test_responses_forwarded_natively_are_redacted(client, db) -> None:
    raw = client.responses.with_raw_response.create(model="fake-model", input=f"{EMAIL} and {PHONE}")
    assert EMAIL in raw.parse().output_text
    [row] = stored_calls(db, raw.headers["x-apprentice-trajectory-id"])
    assert row["protocol"] == "responses"
    assert_clean(row, EMAIL, PHONE)
    assert placeholders(row["request"]) and placeholders(row["response"])


def test_messages_translated_keep_native_and_chat_forms_redacted(gateway, db) -> None:
    client = anthropic.Anthropic(base_url=gateway.url, api_key="unused-in-open-mode", max_retries=0)
    raw = client.messages.with_raw_response.create(
        model="fake-model",
        max_tokens=64,
        system=f"Key {KEY}",
        messages=[{"role": "user", "content": f"{EMAIL} please"}],
    )
    assert raw.parse().content[0].text.startswith(f"{EMAIL} please")
    [row] = stored_calls(db, raw.headers["x-apprentice-trajectory-id"])
    assert row["protocol"] == "messages"
    assert_clean(row, EMAIL, KEY)
    for column in ("request", "response", "native_request", "native_response"):
        assert any(p.startswith("<EMAIL_") for p in placeholders(row[column])), column
    email = placeholders(row["native_request"]["messages"])[0]
    assert email in str(row["request"]) and email in str(row["native_response"])


def test_policy_calls_lose_their_token_ids_only_when_redacted(start_gateway, fake_upstream, db) -> None:
    gateway = start_gateway(
        policies=[
            {"name": "agent", "base_model": "fake-model", "endpoints": [fake_upstream.api_base]},
            {
                "name": "open-agent",
                "base_model": "fake-model",
                "endpoints": [fake_upstream.api_base],
                "redaction": {"enabled": False},
            },
        ]
    )
    client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)

    def call(model: str, text: str) -> dict[str, Any]:
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": text}]
        )
        return stored_calls(db, raw.headers["x-apprentice-trajectory-id"])[0]

    clean = call("agent", "nothing personal here")
    assert clean["response"]["prompt_token_ids"] and clean["response"]["choices"][0]["token_ids"]
    redacted = call("agent", f"{EMAIL} here")
    assert_clean(redacted, EMAIL)
    assert "prompt_token_ids" not in redacted["response"]
    assert "token_ids" not in redacted["response"]["choices"][0]
    assert redacted["response"]["choices"][0]["logprobs"] is None
    kept = call("open-agent", f"{EMAIL} here")  # the policy turned redaction off
    assert EMAIL in kept["request"]["messages"][0]["content"]
    assert kept["response"]["prompt_token_ids"]


def test_redaction_can_be_turned_off_per_kind(start_gateway, db) -> None:
    gateway = start_gateway(redaction={"email": False})
    client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="fake-model", messages=[{"role": "user", "content": f"{EMAIL} {CARD}"}]
    )
    [row] = stored_calls(db, raw.headers["x-apprentice-trajectory-id"])
    content = row["request"]["messages"][0]["content"]
    assert re.fullmatch(rf"{re.escape(EMAIL)} <CARD_\w{{6}}>", content), content


def test_the_request_is_redacted_while_the_upstream_works() -> None:
    """`early` redacts on the event loop's next turn; the record then takes that result."""
    from gateway.redaction.record import RecordRedactor

    async def main() -> None:
        redactor = RecordRedactor(Settings(), b"k" * 32)
        request = {"messages": [{"role": "user", "content": f"mail {EMAIL}"}]}
        redactor.early("call-1", "trajectory-1", None, request, None)
        await asyncio.sleep(0.05)  # the upstream is awaited: the loop runs the redaction
        results = redactor._early["call-1"].results
        assert results is not None and results[0] is not request
        answer = {"choices": [{"message": {"content": "ok"}, "token_ids": [1, 2]}], "prompt_token_ids": [3]}
        record = {"id": "call-1", "trajectory_id": "trajectory-1", "policy": None, "request": request}
        stored = redactor.apply({**record, "response": answer})
        assert stored["request"] is results[0]  # not redacted a second time
        assert re.fullmatch(r"mail <EMAIL_\w{6}>", stored["request"]["messages"][0]["content"])
        assert "prompt_token_ids" not in stored["response"] and answer["prompt_token_ids"] == [3]
        assert request["messages"][0]["content"] == f"mail {EMAIL}"  # what the upstream was sent: untouched
        assert not redactor._early

    asyncio.run(main())


def test_a_text_full_of_values_costs_time_in_proportion() -> None:
    """Overlaps are resolved by bisection, not by comparing every pair: a tool result holding
    5,000 addresses is redacted in a blink (about 25 ms here), not in the seconds a quadratic
    check would take."""
    text = " ".join(f"user{i}@example.com" for i in range(5000))
    started = time.perf_counter()
    redacted = Redaction(compile_rules(RedactionSettings()), b"k" * 32).text(text)
    assert time.perf_counter() - started < 2.0
    assert redacted.count("<EMAIL_") == 5000 and "@" not in redacted
