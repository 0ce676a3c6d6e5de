"""What a longer fuzz found (issue 26), each against a real gateway in keys mode:

- every number the admin API stores is bounded (documented, refused with 400 in OpenAI's format),
  and a bad row already in the database is reported by the listing, not a 500 for all of it;
- NUL in text that reaches a query (path, query, JSON field) is a 400 naming the parameter, from
  the one check every route passes (gateway/http/query_text.py), while a chat call carrying NUL
  is answered and recorded as before (U+FFFD);
- TRACE and other methods on the POST-only protocol paths answer 405 with `Allow`;
- the 400 for a reward's `idempotency_key` that differs from its `Idempotency-Key` header is in
  the OpenAPI document, and so is the 400 for an expected answer's regex that does not compile.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import httpx
import hypothesis
import jsonschema
import openai
import pytest

from apprentice.evalsets.scoring import PYTHON_REGEX_FORMAT
from apprentice.settings import MAX_BUDGET_USD, MAX_REQUESTS_PER_MINUTE, MAX_TOKENS_PER_MINUTE
from tests.conftest import wait_for
from tests.support import schemathesis_hooks

ADMIN_KEY = "apprentice-admin-checks-0123456789"
HUGE = 16284797927731913011899662336  # what the fuzzer stored: past 64 bits


@pytest.fixture
def gateway(start_gateway, fake_upstream):
    policy = {
        "name": "agent",
        "base_model": "fake-model",
        "endpoints": [fake_upstream.api_base],
        "record_tokens": False,
    }
    return start_gateway(
        auth={"mode": "keys", "admin_key": "os.environ/CHECKS_ADMIN_KEY"},
        env={"CHECKS_ADMIN_KEY": ADMIN_KEY},
        policies=[policy],
    )


@pytest.fixture
def admin(gateway) -> httpx.Client:
    return httpx.Client(base_url=gateway.base_url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30)


@pytest.fixture
def client_key(admin) -> dict[str, Any]:
    created = admin.post("/admin/keys", json={"name": "client", "tenant": "acme"})
    assert created.status_code == 201, created.text
    return created.json()


def _refused(answer: httpx.Response, param: str) -> dict[str, Any]:
    assert answer.status_code == 400, (answer.status_code, answer.text)
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    return error


def test_key_limits_are_bounded_and_a_bad_stored_row_does_not_break_the_listing(gateway, admin, client_key, db):
    key_id = client_key["id"]
    for field, too_big in (
        ("requests_per_minute", HUGE),
        ("requests_per_minute", MAX_REQUESTS_PER_MINUTE + 1),
        ("tokens_per_minute", MAX_TOKENS_PER_MINUTE + 1),
        ("budget_usd", MAX_BUDGET_USD * 2),
    ):
        _refused(admin.put(f"/admin/keys/{key_id}/limits", json={field: too_big}), field)
        _refused(admin.post("/admin/keys", json={"name": "n", "limits": {field: too_big}}), f"limits.{field}")
    # JSON's true is not a number (seed 1695329503 found it stored as a limit of 1 a minute).
    for field in ("requests_per_minute", "tokens_per_minute", "budget_usd"):
        _refused(admin.put(f"/admin/keys/{key_id}/limits", json={field: True}), field)
        _refused(admin.post("/admin/keys", json={"name": "n", "limits": {field: False}}), f"limits.{field}")
    rollback = admin.post("/admin/policies/agent/rollback", json={"version": True})
    assert rollback.status_code == 400 and "version" in rollback.text, rollback.text
    infinite = admin.put(
        f"/admin/keys/{key_id}/limits",
        content=b'{"budget_usd": Infinity}',
        headers={"Content-Type": "application/json"},
    )
    _refused(infinite, "budget_usd")
    at_bound = admin.put(f"/admin/keys/{key_id}/limits", json={"requests_per_minute": MAX_REQUESTS_PER_MINUTE})
    assert at_bound.status_code == 200, at_bound.text
    listed = admin.get("/admin/keys")
    assert listed.status_code == 200, listed.text

    # The bounds are in the document.
    spec = httpx.get(gateway.url + "/openapi.json", timeout=60).json()
    limits = spec["components"]["schemas"]["RateLimits"]["properties"]
    maxima = {
        name: next(option["maximum"] for option in schema["anyOf"] if option.get("type") in ("integer", "number"))
        for name, schema in limits.items()
    }
    assert maxima == {
        "requests_per_minute": MAX_REQUESTS_PER_MINUTE,
        "tokens_per_minute": MAX_TOKENS_PER_MINUTE,
        "budget_usd": MAX_BUDGET_USD,
    }

    # A row written by hand before the bounds existed: listed with why it is ignored; the key works.
    db.execute("UPDATE api_keys SET limits = %s::jsonb WHERE id = %s", (f'{{"requests_per_minute": {HUGE}}}', key_id))
    listed = admin.get("/admin/keys")
    assert listed.status_code == 200, listed.text
    [row] = [key for key in listed.json()["keys"] if key["id"] == key_id]
    assert row["limits"] == {} and "requests_per_minute" in row["invalid_limits"]
    assert all(key["invalid_limits"] is None for key in listed.json()["keys"] if key["id"] != key_id)
    client = openai.OpenAI(base_url=gateway.base_url, api_key=client_key["key"], max_retries=0)
    assert client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}]).choices

    # A recorded body may hold any JSON integer (found by the deep fuzz): its trajectory still reads.
    raw = client.chat.completions.with_raw_response.create(
        model="agent", messages=[{"role": "user", "content": "big"}], extra_body={"fuzzed": HUGE}
    )
    trajectory = raw.headers["x-apprentice-trajectory-id"]
    reader = httpx.Client(
        base_url=gateway.base_url, headers={"Authorization": f"Bearer {client_key['key']}"}, timeout=30
    )

    def read_back() -> Any:
        answer = reader.get(f"/trajectories/{trajectory}")
        return answer if answer.status_code != 404 else None

    answer = wait_for(read_back, message="the trajectory recorded")
    assert answer.status_code == 200, answer.text
    assert float(answer.json()["calls"][0]["request"]["fuzzed"]) == pytest.approx(float(HUGE))


def test_nul_in_text_that_reaches_a_query_is_a_400_naming_it_and_a_chat_call_still_carries_it(
    gateway, admin, client_key, db
):
    client = httpx.Client(
        base_url=gateway.base_url, headers={"Authorization": f"Bearer {client_key['key']}"}, timeout=30
    )
    # Query, path and JSON fields of FastAPI's routes, each named.
    _refused(admin.get("/trajectories", params={"policy": "a\x00b"}), "policy")
    _refused(admin.get("/trajectories", params={"group_id": "\x00"}), "group_id")
    _refused(client.get("/trajectories/a%00b"), "trajectory_id")
    _refused(client.delete("/trajectories/a%00b"), "trajectory_id")
    _refused(client.get("/responses/resp_%00"), "response_id")
    _refused(admin.get("/admin/policies/agent%00"), "policy")
    _refused(admin.get("/admin/versions/v%001"), "version")
    _refused(admin.post("/admin/policies/agent/rollback", json={"version_id": "a\x00"}), "version_id")
    _refused(admin.post("/admin/versions/agent-v1/reject", json={"reason": "no\x00"}), "reason")
    _refused(admin.post("/admin/keys", json={"name": "a\x00b"}), "name")
    # The plain handlers that look client text up: rewards, a translated call's previous response.
    _refused(
        client.post("/rewards", json={"trajectory_id": str(uuid.uuid4()), "reward": 1, "comment": "\x00"}), "comment"
    )
    translated = {"model": "agent", "input": "hi", "previous_response_id": "resp_\x00"}
    _refused(client.post("/responses", json=translated), "previous_response_id")
    # Free-form JSON (an evaluation item's messages) at any depth, object keys included.
    created = admin.post("/admin/policies/agent/eval-sets", json={"name": "nul", "scoring": {"method": "judge"}})
    assert created.status_code == 201, created.text
    items = "/admin/policies/agent/eval-sets/nul/items"
    nested = {"role": "user", "content": [{"type": "text", "text": "a\x00"}]}
    _refused(admin.post(items, json={"items": [{"messages": [nested]}]}), "items[0].messages[0].content[0].text")
    keyed = {"role": "user", "content": "hi", "extra": {"k\x00": 1}}
    _refused(admin.post(items, json={"items": [{"messages": [keyed]}]}), "items[0].messages[0].extra.k\x00")
    assert admin.get("/trajectories", params={"policy": "agent"}).status_code == 200  # nothing else changed

    # A chat call's body is the upstream's to judge: answered, and recorded with U+FFFD for NUL.
    chat = client.post(
        "/chat/completions", json={"model": "agent", "messages": [{"role": "user", "content": "nul \x00 here"}]}
    )
    assert chat.status_code == 200, chat.text
    trajectory = chat.headers["x-apprentice-trajectory-id"]

    def recorded() -> Any:
        row = db.execute("SELECT request FROM calls WHERE trajectory_id = %s", (trajectory,)).fetchone()
        return row[0] if row else None

    request = wait_for(recorded, message="the chat call recorded")
    assert request["messages"][0]["content"] == "nul \ufffd here"

    # The document says it: every string parameter and request field of these routes refuses NUL.
    spec = httpx.get(gateway.url + "/openapi.json", timeout=60).json()
    parameters = spec["paths"]["/v1/trajectories"]["get"]["parameters"]
    policy = next(parameter for parameter in parameters if parameter["name"] == "policy")
    text = next(option for option in policy["schema"]["anyOf"] if option["type"] == "string")
    assert re.search(text["pattern"], "a\x00b") is None and re.search(text["pattern"], "agent")
    path = spec["paths"]["/v1/trajectories/{trajectory_id}"]["get"]["parameters"][0]["schema"]
    assert re.search(path["pattern"], "a\x00") is None
    chat_body = spec["components"]["schemas"]["ChatCompletionRequest"]
    assert "\\x00" not in str(chat_body)  # what is forwarded keeps no such rule
    # ... and their free-form JSON is `NulFreeJson`: NUL in none of its strings or keys, at any depth.
    eval_items = jsonschema.Draft202012Validator(
        {"$ref": "#/components/schemas/EvalItemsIn", "components": spec["components"]}
    )
    free = {"role": "user", "content": [{"type": "text", "text": "a"}], "n": [1, 2.5, None, True, {"k": "v"}]}
    assert eval_items.is_valid({"items": [{"messages": [free]}]})
    assert not eval_items.is_valid({"items": [{"messages": [nested]}]})
    assert not eval_items.is_valid({"items": [{"messages": [keyed]}]})
    assert not eval_items.is_valid({"items": [{"messages": [{"role": "user", "n": [[{"deep": "\x00"}]]}]}]})


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens", "/v1/responses", "/responses"])
def test_other_methods_on_the_post_only_protocol_paths_answer_405_with_allow(gateway, client_key, path):
    for method in ("TRACE", "GET", "PUT", "DELETE"):
        answer = httpx.request(method, gateway.url + path, headers={"Authorization": f"Bearer {client_key['key']}"})
        assert (answer.status_code, answer.headers.get("allow")) == (405, "POST"), (method, path, answer.text)
        assert answer.json()["error"]["type"] == "invalid_request_error"


def test_an_idempotency_key_differing_from_its_header_is_a_documented_400(gateway, client_key):
    spec = httpx.get(gateway.url + "/openapi.json", timeout=60).json()
    operation = spec["paths"]["/v1/rewards"]["post"]
    assert "idempotency_key" in operation["responses"]["400"]["description"]
    assert "Idempotency-Key" in operation["responses"]["400"]["description"]
    header = next(parameter for parameter in operation["parameters"] if parameter["name"] == "Idempotency-Key")
    assert "400" in header["description"]

    refused = httpx.post(
        gateway.base_url + "/rewards",
        json={"trajectory_id": str(uuid.uuid4()), "reward": 1, "idempotency_key": "body"},
        headers={"Authorization": f"Bearer {client_key['key']}", "Idempotency-Key": "header"},
    )
    _refused(refused, "idempotency_key")


def test_a_regex_expected_answer_that_does_not_compile_is_a_documented_400(gateway, admin):
    """What a fuzz found (seed 4152699502, 30 examples): `match: regex` with a pattern Python cannot
    compile is a 400, which the document did not say. It says so now with a format of its own,
    which the fuzzer draws from tests/support/schemathesis_hooks.py."""
    scoring = {"method": "expected", "expected": "(C", "match": "regex"}
    refused = admin.post("/admin/policies/agent/eval-sets", json={"name": "regex", "scoring": scoring})
    _refused(refused, "scoring.expected")
    created = admin.post(
        "/admin/policies/agent/eval-sets", json={"name": "regex", "scoring": {**scoring, "expected": "(C)"}}
    )
    assert created.status_code == 201, created.text

    spec = httpx.get(gateway.url + "/openapi.json", timeout=60).json()
    expected = spec["components"]["schemas"]["ExpectedAnswer"]
    assert expected["if"]["properties"]["match"] == {"const": "regex"}
    assert expected["then"]["properties"]["expected"]["format"] == PYTHON_REGEX_FORMAT

    # Only whether each drawn pattern compiles is the claim; how fast a loaded machine draws them is not.
    @hypothesis.settings(max_examples=50, database=None, suppress_health_check=[hypothesis.HealthCheck.too_slow])
    @hypothesis.given(schemathesis_hooks.python_regexes)
    def drawn_patterns_compile(pattern: str) -> None:
        re.compile(pattern)

    drawn_patterns_compile()
