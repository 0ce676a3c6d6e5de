"""Prompts that never repeat train against their task family; runs of several calls count their answers.

The definition of a family (apprentice.grouping.task_family) and the advantage formula are
checked on their own; the rest against the real PostgreSQL, with rows inserted as the gateway
stores them (tests/learner/test_reward_source.py's helpers), through `select`,
`count_new_groups` and a real `run_once` on the tiny model.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from apprentice.grouping import task_family
from apprentice.settings import Settings
from learner.grpo.advantages import family_advantages, family_variance, leave_one_out_baseline
from learner.grpo.grouping import make_groups
from learner.jobs.run import _samples, run_once
from learner.jobs.selection import count_new_groups, select
from tests.learner.test_reward_source import add_reward, add_trajectory, policy

SYSTEM = [{"role": "system", "content": "You answer support tickets."}]


# ------------------------------------------------------------------ the definition


def test_a_family_is_the_clients_name_else_the_system_prompt_and_tools_else_the_policy():
    one = [*SYSTEM, {"role": "user", "content": "my parcel 4711 is late"}]
    other = [*SYSTEM, {"role": "user", "content": "cancel order 99"}]
    tools = [{"type": "function", "function": {"name": "lookup"}}]
    assert task_family("p", one) == task_family("p", other)  # prompts differ, the agent is the same
    assert task_family("p", one).startswith("prompt:")
    assert task_family("p", one, tools) != task_family("p", one)
    assert task_family("p", [{"role": "system", "content": "Other agent."}, one[1]]) != task_family("p", one)
    assert task_family("p", one, named="tickets") == "named:tickets"
    assert task_family("p", [{"role": "user", "content": "hi"}]) == "policy:p"
    # What comes after the first assistant turn is the run, not its setup.
    later = [*one, {"role": "assistant", "content": "ok"}, {"role": "system", "content": "now be brief"}]
    assert task_family("p", later) == task_family("p", one)


def test_family_advantages_follow_the_docstring_formula():
    history = [("a", 1.0), ("b", 0.0), ("c", 1.0), ("d", 0.0)]
    assert leave_one_out_baseline(history, "a", 3) == pytest.approx(1 / 3)
    assert leave_one_out_baseline(history, "x", 3) == pytest.approx(0.5)
    assert leave_one_out_baseline(history, "a", 4) is None  # three others only
    assert family_variance(history) == pytest.approx(0.25) and family_variance([]) == 0.0
    rewards, baselines, variances = [1.0, 0.0, 1.0], [1 / 3, 2 / 3, 0.5], [0.25, 0.16, 0.09]
    centred = [r - b for r, b in zip(rewards, baselines, strict=True)]
    scale = math.sqrt(sum(variances) / 3)
    assert family_advantages(rewards, baselines, variances, "dr_grpo") == pytest.approx(centred)
    assert family_advantages(rewards, baselines, variances, "grpo") == pytest.approx(
        [c / (scale + 1e-4) for c in centred]
    )
    # Every member beat its baseline by the same amount: finite, all positive (no re-centring).
    assert family_advantages([1.0, 1.0], [0.5, 0.5], [0.25, 0.25]) == pytest.approx([1.0, 1.0], rel=1e-3)


def test_a_batch_without_a_success_on_a_rare_success_task_is_pushed_down_gently():
    """2% success: a batch of 32 failures measured against the family (b = 0.02) gets -0.14 each,
    not -1 (its own root mean square), and one success among them about +7, as GRPO would."""
    history = [(f"t{i}", 1.0 if i % 50 == 0 else 0.0) for i in range(200)]  # 2% of the family succeeds
    variance = family_variance(history)
    failures = family_advantages([0.0] * 32, [0.02] * 32, [variance] * 32)
    assert failures == pytest.approx([-0.02 / (math.sqrt(variance) + 1e-4)] * 32)
    assert -0.2 < failures[0] < -0.1
    one_success = family_advantages([1.0] + [0.0] * 31, [0.02] * 32, [variance] * 32)
    assert 6.0 < one_success[0] < 8.0 and one_success[1] == pytest.approx(failures[0])


# ------------------------------------------------------------------ selection and grouping


def unique_prompts(
    db: psycopg.Connection, rewards: list[float | None], family: str | None = "prompt:f", **kwargs: Any
) -> list[str]:
    """One trajectory per reward, every prompt different (a group of one each)."""
    ids = []
    for index, value in enumerate(rewards):
        trajectory = add_trajectory(db, f"ticket {uuid.uuid4()}", [40 + index, 60 + index, 2], **kwargs)
        db.execute("UPDATE trajectories SET task_family = %s WHERE id = %s", (family, trajectory))
        if value is not None:
            add_reward(db, trajectory, value)
        ids.append(trajectory)
    return ids


def test_prompts_that_never_repeat_train_against_their_familys_leave_one_out_baseline(db, database_url):
    rewards = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    ids = unique_prompts(db, rewards)
    settings = policy("webhook", no_judge=True, min_group_size=4)
    with psycopg.connect(database_url, autocommit=True) as connection:
        selection = select(connection, settings)
    grouping = make_groups(selection.members, 4, selection.now, 0.0, selection.may_pool)
    assert grouping.counts()["pooled"] == 6 and not grouping.too_small and not grouping.usable
    samples, skipped, no_signal = _samples(grouping, selection, None, "dr_grpo", 4)
    assert not skipped and not no_signal
    advantages = {s.trajectory_id: s.advantage for s in samples}
    for trajectory, reward in zip(ids, rewards, strict=True):
        others = [r for t, r in zip(ids, rewards, strict=True) if t != trajectory]
        assert advantages[trajectory] == pytest.approx(reward - sum(others) / len(others))


def test_the_baseline_reads_the_familys_trained_rewards_too_and_never_another_family(db, database_url):
    unique_prompts(db, [1.0, 1.0, 1.0], trained=True)  # trained already: baseline only
    unique_prompts(db, [0.0, 0.0, 0.0, 0.0], family="prompt:other")  # another family: never in it
    (lone,) = unique_prompts(db, [0.0])
    with psycopg.connect(database_url, autocommit=True) as connection:
        selection = select(connection, policy("webhook", no_judge=True, min_group_size=4))
    grouping = make_groups(selection.members, 4, selection.now, 0.0, selection.may_pool)
    samples, _, no_signal = _samples(grouping, selection, None, "dr_grpo", 4)
    by_id = {s.trajectory_id: s.advantage for s in samples}
    assert by_id[lone] == pytest.approx(-1.0)  # 0 against the family's three trained 1.0s
    # The other family's members have only each other: 3 others each, all 0 -> no signal, not
    # trained, consumed (or they would trigger runs for ever).
    assert len(by_id) == 1 and len(no_signal) == 4


def test_a_family_with_too_few_rewards_waits_and_the_judges_scores_are_never_pooled(db, database_url):
    few = unique_prompts(db, [1.0, 0.0])
    with psycopg.connect(database_url, autocommit=True) as connection:
        selection = select(connection, policy("webhook", no_judge=True, min_group_size=4))
    grouping = make_groups(selection.members, 4, selection.now, 0.0, selection.may_pool)
    samples, skipped, no_signal = _samples(grouping, selection, None, "grpo", 4)
    assert samples == [] and no_signal == [] and skipped == {"family_too_small": 2}

    for trajectory in few:
        add_reward(db, trajectory, 0.5, "judge")
    with psycopg.connect(database_url, autocommit=True) as connection:
        judged = select(connection, policy("judge", min_group_size=2))
        off = select(connection, policy("webhook", no_judge=True, min_group_size=2, family_baseline=False))
    assert judged.family_rewards == {} and off.family_rewards == {}
    for selected in (judged, off):
        grouping = make_groups(selected.members, 2, selected.now, 0.0, selected.may_pool)
        assert grouping.counts()["pooled"] == 0 and len(grouping.too_small) == 2


# ------------------------------------------------------------------ runs of several calls


def add_run(db: psycopg.Connection, task: str, group_id: str, calls: int, value: float) -> str:
    """A run of `calls` calls in one conversation (each prompt extends the last: one sequence)."""
    trajectory = add_trajectory(db, task, [40, 41, 2], group_id=group_id)
    prompt = [1, 9, 17, 33, 2, 4, 100 + len(task), 40, 41, 2]
    for turn in range(1, calls):
        answer = [50 + turn, 60 + int(value * 10), 2]
        response = {
            "id": "chatcmpl-y",
            "prompt_token_ids": [*prompt, 7, 8],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": str(answer)},
                    "token_ids": answer,
                    "logprobs": {"content": [{"token": "t", "logprob": -3.0} for _ in answer]},
                }
            ],
        }
        request = {"model": "p", "messages": [{"role": "user", "content": task}]}
        db.execute(
            "INSERT INTO calls (id, trajectory_id, tenant, model, policy, upstream_model, created_at, status_code, "
            "request, response, temperature) VALUES (%s, %s, 'acme', 'p', 'p', 'tiny-base', "
            "now() + make_interval(secs => %s), 200, %s, %s, 1.0)",
            (str(uuid.uuid4()), trajectory, turn * 0.001, Jsonb(request), Jsonb(response)),
        )
        prompt = [*prompt, 7, 8, *answer]
    db.execute("UPDATE trajectories SET call_count = %s WHERE id = %s", (calls, trajectory))
    add_reward(db, trajectory, value)
    return trajectory


def test_the_trigger_counts_answers_not_runs_and_pools_small_groups_by_family(db, database_url):
    for name in ("g1", "g2"):
        for index in range(4):
            add_run(db, f"task {name}", name, calls=2, value=float(index % 2))
    with psycopg.connect(database_url, autocommit=True) as connection:
        assert count_new_groups(connection, policy("webhook", no_judge=True, min_group_size=4)) == 4
    unique_prompts(db, [1.0] * 9)  # 9 answers in one family: two groups of four
    with psycopg.connect(database_url, autocommit=True) as connection:
        assert count_new_groups(connection, policy("webhook", no_judge=True, min_group_size=4)) == 6
        no_pool = policy("webhook", no_judge=True, min_group_size=4, family_baseline=False)
        assert count_new_groups(connection, no_pool) == 4 + 9  # as before: each group counts one


def _settings(database_url: str, base: str, tmp_path: Any) -> Settings:
    learning = {"lr": 1e-3, "micro_batch_size": 4, "grad_accumulation": 2, "reward_wait_s": 0, "min_group_size": 4}
    return Settings(
        database_url=database_url,
        data_dir=tmp_path,
        policies=[{"name": "p", "base_model": base, "endpoints": ["http://127.0.0.1:9/v1"], "learning": learning}],
    )


def _run_columns(db: psycopg.Connection, run_id: str | None) -> dict[str, Any]:
    row = db.execute("SELECT metrics, groups, trajectories FROM training_runs WHERE id = %s", (run_id,)).fetchone()
    return {"metrics": row[0], "groups": row[1], "trajectories": row[2]}


def test_runs_of_two_calls_take_as_many_optimizer_steps_per_answer_as_single_calls(
    database_url, db, tiny_model_dir, tmp_path
):
    base = str(tiny_model_dir)
    # 16 answers as 8 runs of two calls (two groups of 4) ...
    for name in ("g1", "g2"):
        for index in range(4):
            trajectory = add_run(db, f"task {name}", name, calls=2, value=float(index % 2))
            db.execute("UPDATE calls SET upstream_model = %s WHERE trajectory_id = %s", (base, trajectory))
    outcome = run_once(_settings(database_url, base, tmp_path / "a"), "p")
    assert outcome.status == "succeeded", outcome.error
    runs = _run_columns(db, outcome.run_id)
    # micro 4 x accumulation 2 = 8 answers a step: 16 answers, 2 steps (one each per 8 runs before)
    assert runs["trajectories"] == 8 and runs["metrics"]["train"]["optimizer_steps"] == 2

    # ... and 16 single calls of unique prompts, one family, trained against its baseline.
    ids = unique_prompts(db, [float(i % 2) for i in range(16)], base_model=base)
    outcome = run_once(_settings(database_url, base, tmp_path / "b"), "p")
    assert outcome.status == "succeeded", outcome.error
    runs = _run_columns(db, outcome.run_id)
    assert runs["trajectories"] == 16 and runs["metrics"]["train"]["optimizer_steps"] == 2
    assert runs["metrics"]["groups"]["pooled"] == 16 and runs["groups"] == 16
    trained = db.execute(
        "SELECT count(*) FROM trajectories WHERE id = ANY(%s::uuid[]) AND trained_in_run_id = %s",
        (ids, outcome.run_id),
    ).fetchone()
    assert trained == (16,)
