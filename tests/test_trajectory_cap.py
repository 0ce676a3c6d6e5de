"""The trajectory length cap (stitching.max_calls_per_trajectory / max_tokens_per_trajectory):
a run that goes on past the cap continues in a new trajectory, and the client is told which."""

from __future__ import annotations

import openai

from tests.conftest import count_rows, wait_for


def _answer(raw) -> dict:
    return raw.parse().choices[0].message.model_dump(exclude_none=True)


def test_a_run_stitched_by_content_moves_to_a_new_trajectory_at_the_call_cap(start_gateway, db):
    gateway = start_gateway(stitching={"max_calls_per_trajectory": 2})
    client = openai.OpenAI(base_url=gateway.base_url, api_key="k", max_retries=0)
    messages: list[dict] = [{"role": "user", "content": "step 0"}]
    ids = []
    for step in range(1, 6):
        raw = client.chat.completions.with_raw_response.create(model="fake-model", messages=messages)
        ids.append(raw.headers["x-apprentice-trajectory-id"])
        assert raw.headers["x-trajectory-id"] == ids[-1]
        messages += [_answer(raw), {"role": "user", "content": f"step {step}"}]
    assert ids[0] == ids[1] != ids[2] == ids[3] != ids[4], ids

    wait_for(lambda: count_rows(db, "SELECT count(*) FROM calls") == 5)
    rows = db.execute(
        "SELECT id::text, call_count FROM trajectories WHERE merged_into IS NULL ORDER BY first_call_at"
    ).fetchall()
    assert rows == [(ids[0], 2), (ids[2], 2), (ids[4], 1)]
    for trajectory_id, calls in ((ids[0], 2), (ids[2], 2), (ids[4], 1)):
        assert count_rows(db, "SELECT count(*) FROM calls WHERE trajectory_id = %s", trajectory_id) == calls


def test_a_named_run_moves_to_its_next_segment_and_keeps_its_name(start_gateway, db):
    gateway = start_gateway(stitching={"max_calls_per_trajectory": 2})
    client = openai.OpenAI(base_url=gateway.base_url, api_key="k", max_retries=0)
    internal = []
    for step in range(3):
        raw = client.chat.completions.with_raw_response.create(
            model="fake-model",
            messages=[{"role": "user", "content": f"independent call {step}"}],
            extra_headers={"X-Trajectory-Id": "endless-run"},
        )
        assert raw.headers["x-trajectory-id"] == "endless-run"
        internal.append(raw.headers["x-apprentice-trajectory-id"])
    assert internal[0] == internal[1] != internal[2]

    wait_for(lambda: count_rows(db, "SELECT count(*) FROM calls") == 3)
    rows = db.execute(
        "SELECT id::text, client_trajectory_id, call_count FROM trajectories ORDER BY first_call_at"
    ).fetchall()
    assert rows == [(internal[0], "endless-run", 2), (internal[2], "endless-run", 1)]
    # Echoing the segment's id continues the segment.
    raw = client.chat.completions.with_raw_response.create(
        model="fake-model",
        messages=[{"role": "user", "content": "echoed"}],
        extra_headers={"X-Trajectory-Id": internal[2]},
    )
    assert raw.headers["x-apprentice-trajectory-id"] == internal[2]


def test_the_token_cap_closes_a_trajectory_too(start_gateway, db):
    # An agent sends its history: the fake upstream counts a message's words + 3 as prompt tokens
    # and answers 20 words, so the calls hold 25, 53 and 81 tokens (prompt + completion). The
    # trajectory's length is its longest call's: 81 >= 60 after the third call, so the fourth
    # starts a new trajectory (summed, 25 + 53 would have cut it after the second).
    gateway = start_gateway(stitching={"max_tokens_per_trajectory": 60})
    client = openai.OpenAI(base_url=gateway.base_url, api_key="k", max_retries=0)
    ids = []
    messages: list[dict[str, str]] = []
    for step in range(4):
        messages.append({"role": "user", "content": f"call {step}"})
        raw = client.chat.completions.with_raw_response.create(
            model="fake-model", messages=messages, extra_headers={"X-Trajectory-Id": "long-run"}
        )
        ids.append(raw.headers["x-apprentice-trajectory-id"])
        messages.append({"role": "assistant", "content": raw.parse().choices[0].message.content or ""})
    assert ids[0] == ids[1] == ids[2] != ids[3]
    wait_for(lambda: count_rows(db, "SELECT count(*) FROM trajectories") == 2)
    longest = db.execute(
        "SELECT max(prompt_tokens + completion_tokens) FROM calls WHERE trajectory_id = %s", (ids[0],)
    ).fetchone()[0]
    assert longest >= 60


def test_a_run_spread_over_n_processes_gets_n_times_the_cap_per_trajectory(start_gateway, db, tmp_path):
    """The figure docs/limits.md states: lengths are counted per process, so a run whose calls
    alternate between N=2 processes fills each trajectory with N x max_calls calls (named run),
    and never more."""
    cap, processes = 2, 2
    gateways = [
        start_gateway(stitching={"max_calls_per_trajectory": cap}, data_dir=tmp_path / f"data{i}")
        for i in range(processes)
    ]
    clients = [openai.OpenAI(base_url=g.base_url, api_key="k", max_retries=0) for g in gateways]
    internal = []
    for step in range(3 * cap * processes):
        raw = clients[step % processes].chat.completions.with_raw_response.create(
            model="fake-model",
            messages=[{"role": "user", "content": f"call {step}"}],
            extra_headers={"X-Trajectory-Id": "spread-run"},
        )
        internal.append(raw.headers["x-apprentice-trajectory-id"])
    per_segment = cap * processes
    segments = [internal[i : i + per_segment] for i in range(0, len(internal), per_segment)]
    assert all(len(set(segment)) == 1 for segment in segments), internal
    assert len({segment[0] for segment in segments}) == 3

    wait_for(lambda: count_rows(db, "SELECT count(*) FROM calls") == len(internal))
    counts = db.execute(
        "SELECT call_count FROM trajectories WHERE client_trajectory_id = 'spread-run' ORDER BY first_call_at"
    ).fetchall()
    assert counts == [(per_segment,)] * 3
