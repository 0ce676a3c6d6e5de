"""Which reward the learner trains on: the webhook's, the judge's, or per group one of them.

Selection against the real PostgreSQL: rows are inserted with SQL as the gateway would store
them (trajectories, their calls, linked rewards), and `select` / `count_new_groups` read them.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from apprentice.settings import PolicySettings, Settings
from learner.grpo.grouping import make_groups
from learner.jobs.run import run_once
from learner.jobs.selection import JUDGE_GRACE_S, Selection, count_new_groups, select

BASE = "tiny-base"  # selection compares model names only; no model is loaded here


def policy(
    source: str | None = None,
    *,
    judge: dict[str, Any] | None = None,
    no_judge: bool = False,
    base_model: str = BASE,
    **learning: Any,
) -> PolicySettings:
    """Policy "p" with a judge (mode "missing" unless told) and the given learning settings."""
    data: dict[str, Any] = {
        "name": "p",
        "base_model": base_model,
        "endpoints": ["http://127.0.0.1:9/v1"],
        "learning": {"reward_wait_s": 0, "reward_source": source, **learning},
    }
    if not no_judge:
        data["judge"] = {"model": "grader", **(judge or {})}
    return PolicySettings.model_validate(data)


def add_trajectory(
    db: psycopg.Connection,
    task: str,
    answer: list[int],
    *,
    tenant: str = "acme",
    group_id: str | None = None,
    age_s: float = 0.0,
    client_id: str | None = None,
    base_model: str = BASE,
    trained: bool = False,
) -> str:
    """One trajectory of policy "p" with one answered call (exact token ids), `age_s` old."""
    trajectory = str(uuid.uuid4())
    db.execute(
        "INSERT INTO trajectories (id, tenant, model, policy, client_trajectory_id, group_id, first_call_at, "
        "last_call_at, call_count, trained_in_run_id) VALUES (%s, %s, 'p', 'p', %s, %s, "
        "now() - make_interval(secs => %s), now() - make_interval(secs => %s), 1, %s)",
        (trajectory, tenant, client_id, group_id, age_s, age_s, str(uuid.uuid4()) if trained else None),
    )
    request = {"model": "p", "messages": [{"role": "user", "content": task}]}
    response = {
        "id": "chatcmpl-x",
        "prompt_token_ids": [1, 9, 17, 33, 2, 4, 100 + len(task)],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": str(answer)},
                "token_ids": answer,
                "logprobs": {"content": [{"token": "t", "logprob": -3.0} for _ in answer]},
            }
        ],
    }
    db.execute(
        "INSERT INTO calls (id, trajectory_id, tenant, model, policy, upstream_model, created_at, status_code, "
        "request, response, temperature) VALUES (%s, %s, %s, 'p', 'p', %s, "
        "now() - make_interval(secs => %s), 200, %s, %s, 1.0)",
        (str(uuid.uuid4()), trajectory, tenant, base_model, age_s, Jsonb(request), Jsonb(response)),
    )
    return trajectory


def add_reward(
    db: psycopg.Connection,
    trajectory: str,
    value: float,
    name: str = "reward",
    *,
    status: str = "linked",
    superseded: bool = False,
    judgement: str | None = None,
) -> None:
    """A reward row on `trajectory`; a "judge" one as the judge stores it (source, judgement id)."""
    judged = name == "judge"
    judgement = judgement or str(uuid.uuid4())
    db.execute(
        "INSERT INTO rewards (id, tenant, target_kind, target, trajectory_id, status, linked_at, name, value, "
        "content_hash, source, judgement_id, observed_at, superseded_at) "
        "SELECT %s, t.tenant, 'trajectory', %s, t.id, %s, now(), %s, %s, '\\x00', %s, %s, now(), "
        "CASE WHEN %s THEN now() END FROM trajectories t WHERE t.id = %s",
        (
            str(uuid.uuid4()),
            trajectory,
            status,
            name,
            value,
            "judge" if judged else "key",
            judgement if judged else None,
            superseded,
            trajectory,
        ),
    )


def group(
    db: psycopg.Connection, task: str, webhook: list[float | None], judge: list[float | None], **kwargs: Any
) -> list[str]:
    """One trajectory per position, each with the webhook reward and judge score given (None: none);
    the judge scored them all in one judgement."""
    ids = []
    judgement = str(uuid.uuid4())
    for index, (w, j) in enumerate(zip(webhook, judge, strict=True)):
        trajectory = add_trajectory(db, task, [40 + index, 50 + len(task), 2], **kwargs)
        if w is not None:
            add_reward(db, trajectory, w)
        if j is not None:
            add_reward(db, trajectory, j, "judge", judgement=judgement)
        ids.append(trajectory)
    return ids


def rewards_of(selection: Selection) -> dict[str, float | None]:
    return {tid: c.member.reward for tid, c in selection.candidates.items()}


def expect(ids: list[str], values: list[float | None]) -> dict[str, float | None]:
    """The {trajectory: reward} that selection should hold for `ids` (None: not a candidate)."""
    return {tid: value for tid, value in zip(ids, values, strict=True) if value is not None}


def run_select(database_url: str, settings: PolicySettings) -> Selection:
    with psycopg.connect(database_url, autocommit=True) as connection:
        return select(connection, settings)


def new_groups(database_url: str, settings: PolicySettings) -> int:
    with psycopg.connect(database_url, autocommit=True) as connection:
        return count_new_groups(connection, settings)


# ------------------------------------------------------------------ one source for every group


@pytest.fixture
def both(db: psycopg.Connection) -> list[str]:
    """Task A: two members with both rewards, one judge-only, one webhook-only."""
    return group(db, "task A", webhook=[1.0, 0.0, None, 0.5], judge=[0.2, 0.9, 0.4, None])


def test_the_webhook_source_trains_on_the_webhook_reward_only(database_url, both):
    selection = run_select(database_url, policy("webhook"))
    assert selection.source == "webhook"
    assert rewards_of(selection) == expect(both, [1.0, 0.0, None, 0.5]), "judge scores are not read"
    assert set(selection.group_sources.values()) == {"webhook"}
    assert selection.skipped == {}


def test_a_policy_without_a_judge_trains_on_its_webhook_reward_by_default(database_url, both):
    selection = run_select(database_url, policy(no_judge=True))
    assert selection.source == "webhook" and selection.wait_s == 0
    assert rewards_of(selection) == expect(both, [1.0, 0.0, None, 0.5])


def test_the_judge_source_trains_on_the_judge_scores_only(database_url, both):
    selection = run_select(database_url, policy("judge", judge={"mode": "always"}))
    assert selection.source == "judge"
    assert rewards_of(selection) == expect(both, [0.2, 0.9, 0.4, None]), "webhook rewards are not read"
    assert set(selection.group_sources.values()) == {"judge"}


def test_the_names_in_use_follow_the_settings(db, database_url):
    ids = group(db, "task A", webhook=[None, None], judge=[None, None])
    add_reward(db, ids[0], 1.0, "outcome")
    add_reward(db, ids[1], 0.0, "outcome")
    add_reward(db, ids[0], 0.3, "judge")  # the default judge name, not the one configured
    add_reward(db, ids[1], 0.7, "grade")
    webhook = run_select(database_url, policy("webhook", reward_name="outcome"))
    assert rewards_of(webhook) == {ids[0]: 1.0, ids[1]: 0.0}
    judge = run_select(database_url, policy("judge", judge={"reward_name": "grade"}))
    assert rewards_of(judge) == {ids[1]: 0.7}


# ------------------------------------------------------------------ webhook_else_judge: per group


def test_webhook_else_judge_decides_per_group_and_never_mixes(db, database_url):
    full = group(db, "all webhook", webhook=[1.0, 0.0, 1.0], judge=[0.3, 0.7, None])
    partial = group(db, "partial webhook", webhook=[1.0, 0.0, None, None], judge=[0.1, 0.4, 0.6, 0.9])
    mostly = group(db, "mostly webhook", webhook=[1.0, 0.0, 1.0, None], judge=[None, None, None, 0.8])
    judged = group(db, "mostly judged", webhook=[1.0, None, None, None], judge=[None, 0.2, 0.5, 0.9])
    tie = group(db, "tie", webhook=[1.0, 0.0, None, None], judge=[None, None, 0.3, 0.6])

    selection = run_select(database_url, policy())  # a judge in mode "missing": the default source
    assert selection.source == "webhook_else_judge"
    assert rewards_of(selection) == {
        **expect(full, [1.0, 0.0, 1.0]),  # every rewarded member has the webhook's
        **expect(partial, [0.1, 0.4, 0.6, 0.9]),  # the judge scored all four
        **expect(mostly, [1.0, 0.0, 1.0, None]),  # webhook 3 > judge 1: the webhook subset
        **expect(judged, [None, 0.2, 0.5, 0.9]),  # judge 3 > webhook 1: the judged subset
        **expect(tie, [None, None, 0.3, 0.6]),  # 2 and 2: the judge
    }
    assert selection.skipped == {"other_reward_source": 4}
    assert sorted(selection.group_sources.values()) == ["judge", "judge", "judge", "webhook", "webhook"]

    grouping = make_groups(selection.members, 2, selection.now, selection.wait_s)
    assert len(grouping.usable) == 5
    for trained in grouping.usable:  # the groups that train are the groups that chose
        source = selection.group_sources[trained.key]
        candidates = [selection.candidates[m.trajectory_id] for m in trained.members]
        assert [m.reward for m in trained.members] == [getattr(c, source) for c in candidates], source


def test_a_group_judged_in_chunks_trains_as_one_group_per_chunk(db, database_url):
    """The judge's scores compare only the members it read together (one judgement)."""
    first = group(db, "large task", webhook=[None] * 3, judge=[0.1, 0.5, 0.9])
    second = group(db, "large task", webhook=[None] * 3, judge=[0.2, 0.6, 1.0])
    selection = run_select(database_url, policy())
    assert rewards_of(selection) == {**expect(first, [0.1, 0.5, 0.9]), **expect(second, [0.2, 0.6, 1.0])}
    grouping = make_groups(selection.members, 2, selection.now, selection.wait_s)
    assert sorted(sorted(m.trajectory_id for m in g.members) for g in grouping.usable) == sorted(
        [sorted(first), sorted(second)]
    )
    assert all(selection.group_sources[g.key] == "judge" for g in grouping.usable)


def test_webhook_else_judge_groups_are_tenant_scoped(db, database_url):
    acme = group(db, "same task", webhook=[1.0, 0.0], judge=[0.4, None])
    other = group(db, "same task", webhook=[1.0, None], judge=[0.2, 0.8], tenant="other")
    selection = run_select(database_url, policy())
    assert rewards_of(selection) == {**expect(acme, [1.0, 0.0]), **expect(other, [0.2, 0.8])}


def test_webhook_else_judge_groups_by_the_client_group_id(db, database_url):
    """Two client groups of one task decide apart; the task alone would have made them one group."""
    first = group(db, "shared task", webhook=[1.0, 0.0], judge=[None, 0.5], group_id="g1")
    second = group(db, "shared task", webhook=[1.0, None], judge=[0.3, 0.6], group_id="g2")
    selection = run_select(database_url, policy())
    assert rewards_of(selection) == {**expect(first, [1.0, 0.0]), **expect(second, [0.3, 0.6])}


# ------------------------------------------------------------------ what is never read


def test_the_judges_own_trajectories_are_never_read(db, database_url):
    own = group(db, "judge prompt", webhook=[1.0, 0.0], judge=[0.1, 0.9], client_id="apprentice-judge:g1")
    waiting_own = add_trajectory(db, "judge prompt 2", [5, 2], client_id="apprentice-judge:g2")
    client = group(db, "client task", webhook=[1.0, 0.0], judge=[None, None], client_id="my-run")
    for settings in (policy("webhook"), policy("judge"), policy(), policy("webhook", reward_wait_s=600)):
        selection = run_select(database_url, settings)
        assert not set(own) & set(selection.candidates), settings.reward_source
        assert waiting_own not in {m.trajectory_id for m in selection.waiting}
    assert set(run_select(database_url, policy("webhook")).candidates) == set(client)
    assert new_groups(database_url, policy("judge")) == 0, "only the judge's own trajectories carry its scores"
    assert new_groups(database_url, policy("webhook")) == 1, "the client's group, not the judge's"


def test_superseded_and_rejected_rewards_are_ignored(db, database_url):
    (updated, gone, rejected, current) = group(db, "task", webhook=[None] * 4, judge=[None] * 4)
    add_reward(db, updated, 1.0, superseded=True)
    add_reward(db, updated, 0.0)
    add_reward(db, gone, 0.9, "judge", superseded=True)
    add_reward(db, rejected, 1.0, status="rejected")
    add_reward(db, rejected, 0.5, "judge", status="rejected")
    add_reward(db, current, 1.0)
    add_reward(db, current, 0.6, "judge")
    webhook = run_select(database_url, policy("webhook"))
    assert rewards_of(webhook) == {updated: 0.0, current: 1.0}
    judge = run_select(database_url, policy("judge"))
    assert rewards_of(judge) == {current: 0.6}


# ------------------------------------------------------------------ waiting for rewards and the judge


def test_the_waiting_window_grows_by_the_judges_time(db, database_url):
    judge = {"wait_s": 30, "poll_interval_s": 10}
    assert run_select(database_url, policy("webhook", judge=judge, reward_wait_s=60)).wait_s == 60
    window = 60 + 10 + JUDGE_GRACE_S
    assert run_select(database_url, policy(judge=judge, reward_wait_s=60)).wait_s == window
    assert run_select(database_url, policy("judge", judge=judge, reward_wait_s=60)).wait_s == window
    later = {"wait_s": 600, "poll_interval_s": 10}
    assert run_select(database_url, policy(judge=later, reward_wait_s=60)).wait_s == 600 + 10 + JUDGE_GRACE_S


def test_a_trajectory_waits_while_it_has_no_reward_of_a_name_in_use(db, database_url):
    judge = {"wait_s": 30, "poll_interval_s": 10}  # window: 60 + 10 + 120 = 190 s
    unrewarded_recent = add_trajectory(db, "t1", [5, 2], age_s=20)
    unrewarded_150 = add_trajectory(db, "t2", [5, 2], age_s=150)
    add_trajectory(db, "t3", [5, 2], age_s=250)  # unrewarded, past every window: never waits
    webhook_only = add_trajectory(db, "t4", [5, 2], age_s=20)
    add_reward(db, webhook_only, 1.0)
    judge_only = add_trajectory(db, "t5", [5, 2], age_s=20)
    add_reward(db, judge_only, 0.5, "judge")

    def waiting(settings: PolicySettings) -> set[str]:
        return {m.trajectory_id for m in run_select(database_url, settings).waiting}

    assert waiting(policy("webhook", judge=judge, reward_wait_s=60)) == {unrewarded_recent, judge_only}
    assert waiting(policy(judge=judge, reward_wait_s=60)) == {unrewarded_recent, unrewarded_150}
    assert waiting(policy("judge", judge=judge, reward_wait_s=60)) == {
        unrewarded_recent,
        unrewarded_150,
        webhook_only,
    }
    assert waiting(policy("webhook", judge=judge, reward_wait_s=0)) == set(), "no wait: nothing read"


def test_a_group_with_partial_webhook_rewards_waits_for_the_judge(db, database_url):
    """Past reward_wait_s but within the judge's window: the group holds instead of training on
    its webhook half, then trains on the judge's scores of all of it."""
    judge = {"wait_s": 60, "poll_interval_s": 10}
    ids = group(db, "task", webhook=[1.0, 0.0, None, None], judge=[None] * 4, age_s=100)

    def classify(settings: PolicySettings) -> Any:
        selection = run_select(database_url, settings)
        return make_groups(selection.members, 2, selection.now, selection.wait_s)

    webhook_only = classify(policy("webhook", judge=judge, reward_wait_s=60))
    assert [sorted(g.rewards) for g in webhook_only.usable] == [[0.0, 1.0]], "webhook alone: trains now"
    held = classify(policy(judge=judge, reward_wait_s=60))
    assert held.counts()["waiting"] == 1 and not held.usable

    judgement = str(uuid.uuid4())  # the judge scores the whole group in one judgement
    for trajectory, score in zip(ids, [0.1, 0.4, 0.6, 0.9], strict=True):
        add_reward(db, trajectory, score, "judge", judgement=judgement)
    judged = classify(policy(judge=judge, reward_wait_s=60))
    assert [{m.trajectory_id: m.reward for m in g.members} for g in judged.usable] == [
        dict(zip(ids, [0.1, 0.4, 0.6, 0.9], strict=True))
    ]


def test_a_group_the_judge_never_scores_trains_on_its_webhook_subset_after_the_window(db, database_url):
    group(db, "task", webhook=[1.0, 0.0, None], judge=[None] * 3, age_s=60 + 10 + JUDGE_GRACE_S + 30)
    selection = run_select(database_url, policy(judge={"wait_s": 60, "poll_interval_s": 10}, reward_wait_s=60))
    grouping = make_groups(selection.members, 2, selection.now, selection.wait_s)
    assert not selection.waiting and [sorted(g.rewards) for g in grouping.usable] == [[0.0, 1.0]]


# ------------------------------------------------------------------ the trigger's count


def test_count_new_groups_counts_groups_rewarded_by_a_name_in_use(db, database_url):
    group(db, "A", webhook=[1.0, 0.0], judge=[None, None])
    group(db, "A", webhook=[1.0, None], judge=[None, None], tenant="other")  # another tenant: another group
    group(db, "B", webhook=[None, None], judge=[0.2, 0.8])
    group(db, "C", webhook=[1.0, 0.0], judge=[0.5, 0.5])
    group(db, "D", webhook=[None, None], judge=[None, None])  # unrewarded
    group(db, "E", webhook=[1.0, 0.0], judge=[0.1, 0.2], trained=True)  # trained already
    superseded = add_trajectory(db, "F", [5, 2])
    add_reward(db, superseded, 1.0, superseded=True)
    add_reward(db, superseded, 0.3, "judge", superseded=True)
    # A (other) has one rewarded member: under min_group_size (2) it trains against its family,
    # where it counts one group per 2 answers: alone, none yet.
    assert new_groups(database_url, policy("webhook")) == 2  # A, C
    assert new_groups(database_url, policy("judge")) == 2  # B, C (the judge's scores are never pooled)
    assert new_groups(database_url, policy()) == 3  # A, B, C


# ------------------------------------------------------------------ the run's record


def test_a_run_records_how_many_groups_trained_on_each_source(database_url, db, tiny_model_dir, tmp_path):
    base = str(tiny_model_dir)
    webhook = group(db, "task W", webhook=[1.0, 0.0, 1.0], judge=[None, 0.5, None], base_model=base)
    judged = group(db, "task J", webhook=[1.0, None, None], judge=[0.1, 0.9, 0.5], base_model=base)
    settings = Settings(
        database_url=database_url,
        data_dir=tmp_path,
        policies=[
            {
                "name": "p",
                "base_model": base,
                "endpoints": ["http://127.0.0.1:9/v1"],
                "learning": {"lr": 1e-3, "micro_batch_size": 4, "grad_accumulation": 2, "reward_wait_s": 0},
                "judge": {"model": "p", "wait_s": 0, "api_key": "sk-judge"},
            }
        ],
    )
    outcome = run_once(settings, "p")
    assert outcome.status == "succeeded", outcome.error
    metrics = db.execute("SELECT metrics FROM training_runs WHERE id = %s", (outcome.run_id,)).fetchone()[0]
    assert metrics["reward_source"] == "webhook_else_judge"
    assert metrics["reward_sources"] == {"webhook": 1, "judge": 1}
    used = dict(
        db.execute(
            "SELECT id::text, trained_in_run_id::text FROM trajectories WHERE id = ANY(%s::uuid[])",
            (webhook + judged,),
        ).fetchall()
    )
    assert [used[t] for t in webhook + judged] == [outcome.run_id] * 6
