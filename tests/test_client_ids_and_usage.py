"""Two surprises fixed: a client that names its run gets its own name back, and every streamed
call is recorded with its token usage whether or not the client asked for it."""

from __future__ import annotations

import httpx
import openai

from tests.conftest import count_rows, wait_for


def test_a_client_named_run_gets_its_own_id_back_and_may_use_it_everywhere(start_gateway, db):
    gateway = start_gateway()
    client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}], extra_headers={"X-Trajectory-Id": "run-42"}
    )
    assert raw.headers["x-trajectory-id"] == "run-42"
    internal = raw.headers["x-apprentice-trajectory-id"]
    assert internal != "run-42"
    wait_for(lambda: count_rows(db, "SELECT count(*) FROM trajectories WHERE id = %s", internal) == 1)
    assert db.execute("SELECT client_trajectory_id FROM trajectories WHERE id = %s", (internal,)).fetchone() == (
        "run-42",
    )
    # The name is accepted where the internal id is: the rewards' trajectory_id, the trajectory API.
    reward = httpx.post(gateway.base_url + "/rewards", json={"trajectory_id": "run-42", "reward": 1.0})
    assert reward.status_code == 200 and reward.json()["trajectory_id"] == internal, reward.text
    by_name = httpx.get(gateway.base_url + "/trajectories/run-42")
    assert by_name.status_code == 200 and by_name.json()["id"] == internal

    unnamed = client.chat.completions.with_raw_response.create(
        model="fake-model", messages=[{"role": "user", "content": "another"}]
    )
    assert unnamed.headers["x-trajectory-id"] == unnamed.headers["x-apprentice-trajectory-id"]


def test_a_streamed_call_is_recorded_with_its_usage_that_the_client_did_not_ask_for(start_gateway, db, fake_upstream):
    gateway = start_gateway()
    upstream = f"http://127.0.0.1:{fake_upstream.port}/_requests"
    httpx.delete(upstream)
    client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
    chunks = list(
        client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "count"}], stream=True, max_tokens=20
        )
    )
    assert chunks and all(chunk.usage is None for chunk in chunks), "no usage reached a client that did not ask"
    assert all(chunk.choices for chunk in chunks), "the usage-only chunk was removed"
    assert httpx.get(upstream).json()["requests"][-1]["stream_options"] == {"include_usage": True}

    asked = list(
        client.chat.completions.create(
            model="fake-model",
            messages=[{"role": "user", "content": "count again"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert asked[-1].usage is not None and asked[-1].choices == []

    def recorded() -> list[tuple[int | None, int | None]] | None:
        rows = db.execute(
            "SELECT prompt_tokens, completion_tokens FROM calls WHERE stream ORDER BY created_at"
        ).fetchall()
        return rows if len(rows) == 2 else None

    rows = wait_for(recorded, message="both streamed calls stored")
    assert all(prompt and completion for prompt, completion in rows), rows
