"""Reward functions score what no client rewarded, and every run carries its task family.

A real gateway in front of the fake upstream, real PostgreSQL, the official openai client; the
operator's HTTP scorer is a real HTTP server in this process that checks the signature, and the
Python scorer is an entry point in tests/support/reward_functions.py.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai

from apprentice.grouping import task_family
from gateway.rewards.signatures import compute_signature, parse_header
from tests.conftest import count_rows, wait_for
from tests.support.post_endpoint import PostEndpoint, Reply

SECRET = "whsec-scorer"
SYSTEM = "You answer support tickets."


class Scorer:
    """The operator's endpoint: verifies the signature, scores by the answer's length."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.bad_signatures = 0
        self.endpoint = PostEndpoint(self.answer)
        self.url = f"{self.endpoint.base_url}/score"

    def answer(self, path: str, headers: dict[str, str], body: bytes) -> Reply:
        stamp, signatures = parse_header(headers.get("Apprentice-Signature", ""))
        if compute_signature(SECRET, stamp, body) not in signatures:
            self.bad_signatures += 1
            return 401, "text/plain", b""
        payload = json.loads(body)
        self.received.append(payload)
        return 200, "application/json", json.dumps({"score": len(payload["answer"]["content"]) / 1000.0}).encode()

    def close(self) -> None:
        self.endpoint.close()


def _policy(functions: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "name": "agent",
        "base_model": "fake-base",
        "learning": {"enabled": False},
        "reward_functions": [{"poll_interval_s": 0.2, "wait_s": 0.5, **f} for f in functions],
    }


def _entry(api_base: str) -> dict[str, Any]:
    return {
        "model_name": "agent",
        "litellm_params": {"model": "openai/fake-model", "api_base": api_base, "api_key": "sk-upstream-secret"},
    }


def _call(client: openai.OpenAI, ticket: str, **headers: str) -> str:
    raw = client.chat.completions.with_raw_response.create(
        model="agent",
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": ticket}],
        extra_headers=headers,
    )
    return raw.headers["x-apprentice-trajectory-id"]


def _function_rewards(db, name: str) -> dict[str, tuple[float, str, str]]:
    rows = db.execute(
        "SELECT trajectory_id::text, value, source, idempotency_key FROM rewards WHERE name = %s "
        "AND status = 'linked' AND superseded_at IS NULL",
        (name,),
    ).fetchall()
    return {r[0]: (r[1], r[2], r[3]) for r in rows}


def test_an_http_reward_function_scores_unrewarded_runs_signed_and_once(start_gateway, fake_upstream, db):
    scorer = Scorer()
    try:
        gateway = start_gateway(
            model_list=[_entry(fake_upstream.api_base)],
            policies=[_policy([{"name": "reward", "url": scorer.url, "secret": SECRET, "wait_s": 1.0}])],
        )
        client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
        rewarded = _call(client, "ticket 1: my parcel is late")
        # The client's reward arrives within wait_s: the function leaves that run alone.
        answer = httpx.post(gateway.base_url + "/rewards", json={"trajectory_id": rewarded, "reward": 0.9})
        assert answer.status_code == 200, answer.text
        others = [_call(client, f"ticket {n}: where is order {n}?") for n in range(2, 5)]
        scores = wait_for(
            lambda: (s := _function_rewards(db, "reward")) and len(s) == 4 and s, timeout=30, message="scored"
        )
        assert scores[rewarded] == (0.9, "key", None) or scores[rewarded][1] != "function"
        for trajectory in others:
            value, source, key = scores[trajectory]
            assert source == "function" and key == f"function:reward:{trajectory}"
            assert 0.0 < value < 1.0
        assert scorer.bad_signatures == 0 and len(scorer.received) == 3, "each scored once"
        payload = scorer.received[0]
        assert payload["messages"][0] == {"role": "system", "content": SYSTEM}
        assert payload["messages"][-1] == payload["answer"] and payload["answer"]["role"] == "assistant"
        assert payload["reward_name"] == "reward" and payload["policy"] == "agent"
        # Why the answer ended, as the client saw it: a scorer cannot tell a cut answer from its text.
        assert payload["finish_reason"] == "stop" and payload["calls"][-1]["finish_reason"] == "stop"
        rows = db.execute("SELECT status, attempts FROM function_scorings").fetchall()
        assert sorted(rows) == [("scored", 1)] * 3
    finally:
        scorer.close()


def test_the_budget_bounds_scorings_and_a_failing_function_stops_after_its_attempts(start_gateway, fake_upstream, db):
    gateway = start_gateway(
        model_list=[_entry(fake_upstream.api_base)],
        policies=[
            _policy(
                [
                    {
                        "name": "words",
                        "entry_point": "tests.support.reward_functions:answer_words",
                        "max_calls_per_hour": 2,
                    },
                    {"name": "never", "entry_point": "tests.support.reward_functions:broken", "max_attempts": 2},
                ]
            )
        ],
    )
    client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
    ids = [_call(client, f"ticket {n}") for n in range(4)]
    wait_for(lambda: len(_function_rewards(db, "words")) == 2, timeout=30, message="two scored")
    wait_for(
        lambda: (
            count_rows(
                db, "SELECT count(*) FROM function_scorings WHERE name = 'never' AND attempts = 2 AND status = 'failed'"
            )
            == 4
        ),
        timeout=30,
        message="every failing scoring tried twice",
    )
    import time

    time.sleep(1.5)  # several more polls: the budget holds, the failures stay given up
    assert len(_function_rewards(db, "words")) == 2
    assert count_rows(db, "SELECT count(*) FROM function_scorings WHERE name = 'words'") == 2
    assert count_rows(db, "SELECT max(attempts) FROM function_scorings WHERE name = 'never'") == 2
    assert set(_function_rewards(db, "words")) <= set(ids)
    assert _function_rewards(db, "never") == {}


def test_every_policy_run_records_its_task_family(start_gateway, fake_upstream, db):
    gateway = start_gateway(model_list=[_entry(fake_upstream.api_base)], policies=[_policy([])])
    client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
    by_prompt = [_call(client, "ticket A"), _call(client, "ticket B")]
    named = _call(client, "ticket C", **{"X-Task-Family": "refunds"})
    in_metadata = client.chat.completions.with_raw_response.create(
        model="agent", messages=[{"role": "user", "content": "hello"}], metadata={"task_family": "refunds"}
    ).headers["x-apprentice-trajectory-id"]
    bare = client.chat.completions.with_raw_response.create(
        model="agent", messages=[{"role": "user", "content": "hello again"}]
    ).headers["x-apprentice-trajectory-id"]
    wait_for(lambda: count_rows(db, "SELECT count(*) FROM trajectories WHERE task_family IS NOT NULL") == 5)
    family = dict(db.execute("SELECT id::text, task_family FROM trajectories").fetchall())
    expected = task_family("agent", [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "x"}])
    assert family[by_prompt[0]] == family[by_prompt[1]] == expected
    assert family[named] == family[in_metadata] == "named:refunds"
    assert family[bare] == "policy:agent"
    upstream = httpx.get(f"http://127.0.0.1:{fake_upstream.port}/_requests").json()["requests"]
    assert all("task_family" not in (r.get("metadata") or {}) for r in upstream), "removed before forwarding"
