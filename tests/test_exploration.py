"""Exploration samples (gateway/exploration): after a client has its answer, the gateway asks the
policy's lineage head for k more answers at low priority and records them as unserved attempts
in the served call's group, with exact token ids and logprobs, never returned to anyone.

Real gateway, real PostgreSQL, the official openai client; the policy's endpoint is the fake
upstream (it answers `n`, logprobs and token ids like vLLM, and lists what it was sent). The
learner's own selection reads what was stored, to show the attempts are data it understands.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import openai
import psycopg

from apprentice.settings import PolicySettings
from learner.grpo.grouping import group_key
from learner.jobs.selection import select
from tests.conftest import count_rows, wait_for

POLICY = "explorer-agent"


def policy(api_base: str, **exploration: Any) -> dict[str, Any]:
    settings = {"extra_answers": 2, "budget_tokens_per_hour": 100_000, **exploration}
    return {
        "name": POLICY,
        "base_model": "fake-base",
        "temperature": 1.0,
        "endpoints": [api_base],
        "learning": {"reward_wait_s": 0, "exploration": settings},
    }


def forwarded(fake_upstream) -> list[dict[str, Any]]:
    return httpx.get(f"http://127.0.0.1:{fake_upstream.port}/_requests").json()["requests"]


def clear(fake_upstream) -> None:
    httpx.delete(f"http://127.0.0.1:{fake_upstream.port}/_requests")


def unserved(db: psycopg.Connection, count: int) -> list[tuple]:
    return wait_for(
        lambda: (
            (
                rows := db.execute(
                    """SELECT c.explores_call_id, c.response, c.request, c.adapter_version_id, c.upstream_model,
                              c.completion_tokens, c.response_id, c.continuation_key, t.id, t.group_id, t.served
                       FROM calls c JOIN trajectories t ON t.id = c.trajectory_id
                       WHERE c.explores_call_id IS NOT NULL ORDER BY c.created_at"""
                ).fetchall()
            )
            and len(rows) >= count
            and rows
        ),
        message=f"{count} unserved attempts",
    )


def test_unserved_attempts_join_the_served_calls_group_with_exact_tokens(
    start_gateway, fake_upstream, db, database_url
):
    # A candidate newer than anything promoted: the lineage head, not serving yet.
    head_id = uuid.uuid4()
    db.execute(
        """INSERT INTO adapter_versions (id, policy, version, name, status, base_model, path)
           VALUES (%s, %s, 1, 'explorer-agent-v1', 'candidate', 'fake-base', '/nowhere')""",
        (head_id, POLICY),
    )
    gateway = start_gateway(policies=[policy(fake_upstream.api_base)], adapter_poll_interval_s=0.2)
    client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
    clear(fake_upstream)
    raw = client.chat.completions.with_raw_response.create(
        model=POLICY,
        messages=[{"role": "user", "content": "name a colour"}],
        extra_headers={"X-Group-Id": "colours-1"},
    )
    answer = raw.http_response.json()
    served_call = raw.headers["x-apprentice-call-id"]
    served_trajectory = raw.headers["x-apprentice-trajectory-id"]
    # the client sees its one answer, as it would have without exploration
    assert len(answer["choices"]) == 1 and answer["choices"][0]["index"] == 0
    assert "token_ids" not in answer["choices"][0] and "prompt_token_ids" not in answer

    rows = unserved(db, 2)
    assert len(rows) == 2
    for explores, response, request, version, upstream_model, tokens, response_id, key, _, group, served in rows:
        assert str(explores) == served_call and served is False and group == "colours-1"
        assert version == head_id and upstream_model == "explorer-agent-v1", "sampled by the lineage head"
        assert request["messages"] == [{"role": "user", "content": "name a colour"}]
        [choice] = response["choices"]
        assert choice["index"] == 0 and len(choice["token_ids"]) == 20 == tokens
        assert len(choice["logprobs"]["content"]) == 20 and response["prompt_token_ids"] == list(range(1, 11))
        assert response_id is None and key is None, "no client can continue or reference an unserved answer"
    assert rows[0][1]["choices"][0]["message"] != rows[1][1]["choices"][0]["message"]
    served_row = db.execute("SELECT served, group_id FROM trajectories WHERE id = %s", (served_trajectory,)).fetchone()
    assert served_row == (True, "colours-1")

    bodies = forwarded(fake_upstream)
    assert [b.get("n") for b in bodies] == [None, 2], "the client's call, then one exploration request of n=2"
    explored = bodies[1]
    assert explored["model"] == "explorer-agent-v1" and explored["priority"] == 10 and explored["stream"] is False
    assert explored["logprobs"] is True and explored["return_token_ids"] is True and explored["temperature"] == 1.0
    assert "priority" not in bodies[0], "the client's own call keeps the default priority"

    # The learner reads the attempts as members of the served call's group, with their token ids.
    for trajectory, value in [(served_trajectory, 1.0), (str(rows[0][8]), 0.0), (str(rows[1][8]), 0.5)]:
        posted = httpx.post(gateway.base_url + "/rewards", json={"trajectory_id": trajectory, "reward": value})
        assert posted.status_code == 200, posted.text
    settings = PolicySettings.model_validate(policy(fake_upstream.api_base))
    with psycopg.connect(database_url, autocommit=True) as connection:
        candidates = wait_for(lambda: (c := select(connection, settings).candidates) and len(c) == 3 and c)
    assert served_trajectory in candidates and len({group_key(c.member) for c in candidates.values()}) == 1
    for trajectory, _ in [(str(rows[0][8]), 0), (str(rows[1][8]), 1)]:
        [call] = candidates[trajectory].calls
        assert call.completion_ids == [100 + i for i in range(20)] and call.logprobs is not None

    # the spend, in /metrics and the admin API
    metrics = httpx.get(gateway.url + "/metrics").text
    assert f'apprentice_exploration_tokens_total{{policy="{POLICY}"}} 40.0' in metrics
    assert f'apprentice_exploration_answers_total{{policy="{POLICY}"}} 2.0' in metrics
    report = httpx.get(gateway.url + f"/v1/admin/policies/{POLICY}/exploration").json()
    assert report["recorded_last_hour"] == {"window_s": 3600.0, "answers": 2, "explored_calls": 1, "tokens": 40}
    assert report["this_process"]["used_last_hour"] == 40 and report["settings"]["extra_answers"] == 2


def test_streamed_calls_are_explored_after_the_stream(start_gateway, fake_upstream, db):
    gateway = start_gateway(policies=[policy(fake_upstream.api_base, extra_answers=1)])
    client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
    clear(fake_upstream)
    stream = client.chat.completions.create(
        model=POLICY, messages=[{"role": "user", "content": "stream it"}], stream=True
    )
    chunks = list(stream)
    assert chunks and all(len(c.choices) <= 1 for c in chunks)
    [(explores, response, *_rest)] = unserved(db, 1)
    assert len(response["choices"][0]["token_ids"]) == 20
    bodies = forwarded(fake_upstream)
    assert bodies[0]["stream"] is True and bodies[1]["stream"] is False and "stream_options" not in bodies[1]
    base_call = db.execute("SELECT upstream_model FROM calls WHERE explores_call_id IS NOT NULL").fetchone()
    assert base_call == ("fake-base",), "nothing in the lineage: the base model explores"


def test_temperature_zero_seed_and_untrained_keys_are_never_explored(
    start_gateway, fake_upstream, db, database_url, tmp_path
):
    from tests.test_auth import cli

    def create(name: str) -> str:
        created = cli(database_url, tmp_path, "keys", "create", "--name", name, "--tenant", "acme")
        assert created.returncode == 0, created.stderr
        return created.stdout.strip()

    trains, private = create("trains"), create("private")
    opted = cli(database_url, tmp_path, "keys", "training", private[:12], "--opt-out")
    assert opted.returncode == 0, opted.stderr
    admin_key = "admin-key-for-exploration-tests"
    gateway = start_gateway(
        policies=[{**policy(fake_upstream.api_base), "temperature": None}],
        auth={"mode": "keys", "admin_key": admin_key},
    )
    client = openai.OpenAI(base_url=gateway.base_url, api_key=trains, max_retries=0)
    messages = [{"role": "user", "content": "hello"}]
    client.chat.completions.create(model=POLICY, messages=messages, temperature=0)
    client.chat.completions.create(model=POLICY, messages=messages, seed=7)
    openai.OpenAI(base_url=gateway.base_url, api_key=private, max_retries=0).chat.completions.create(
        model=POLICY, messages=messages
    )
    client.chat.completions.create(model=POLICY, messages=messages, temperature=0.7)  # the one explored
    unserved(db, 2)
    wait_for(lambda: count_rows(db, "SELECT count(*) FROM calls WHERE explores_call_id IS NULL") == 4)
    explored = db.execute(
        """SELECT s.request FROM calls u JOIN calls s ON s.id = u.explores_call_id
           WHERE u.explores_call_id IS NOT NULL"""
    ).fetchall()
    assert {str(r[0].get("temperature")) for r in explored} == {"0.7"}
    metrics = httpx.get(gateway.url + "/metrics", headers={"Authorization": f"Bearer {admin_key}"}).text
    for reason in ("temperature_0", "seed", "not_trained"):
        assert f'apprentice_exploration_calls_total{{outcome="skipped_{reason}",policy="{POLICY}"}} 1.0' in metrics


def test_the_budget_bounds_the_extra_tokens(start_gateway, fake_upstream, db):
    # k=2 answers of at most 20 tokens reserve 40 tokens a call: a 100-token budget allows two calls.
    gateway = start_gateway(policies=[policy(fake_upstream.api_base, budget_tokens_per_hour=100, concurrency=1)])
    client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
    clear(fake_upstream)
    for i in range(5):
        client.chat.completions.create(model=POLICY, messages=[{"role": "user", "content": f"task {i}"}], max_tokens=20)
        wait_for(
            lambda: (
                httpx.get(gateway.url + f"/v1/admin/policies/{POLICY}/exploration").json()["this_process"]["queued"]
                == 0
            )
        )
    metrics = wait_for(
        lambda: (
            (text := httpx.get(gateway.url + "/metrics").text)
            and f'apprentice_exploration_requests_total{{outcome="over_budget",policy="{POLICY}"}} 3.0' in text
            and text
        ),
        message="three calls over budget",
    )
    assert f'apprentice_exploration_tokens_total{{policy="{POLICY}"}} 40.0' not in metrics
    assert f'apprentice_exploration_tokens_total{{policy="{POLICY}"}} 80.0' in metrics
    rows = unserved(db, 4)
    assert len(rows) == 4 and sum(r[5] for r in rows) == 80 <= 100
    assert len([b for b in forwarded(fake_upstream) if b.get("n") == 2]) == 2, "no request beyond the budget was sent"
