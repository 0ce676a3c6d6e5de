"""Grouping: by the client's group id, else by the task; what trains and what is set aside."""

from __future__ import annotations

import pytest

from apprentice.grouping import task_key, task_messages
from learner.grpo.advantages import group_advantages
from learner.grpo.grouping import Member, completion_key, group_key, make_groups

SYSTEM = {"role": "system", "content": "Be brief."}


def member(
    tid: str,
    reward: float | None,
    *,
    task: str = "t1",
    group: str | None = None,
    tenant: str = "acme",
    greedy: bool = False,
    answer: str | None = None,
    at: float = 0.0,
) -> Member:
    return Member(tid, tenant, reward, group, task, greedy, completion_key([answer or tid]), at)


def test_task_key_is_the_messages_before_the_first_assistant_turn_and_the_tools():
    ask = [SYSTEM, {"role": "user", "content": "Name a colour."}]
    later = ask + [{"role": "assistant", "content": "Red."}, {"role": "user", "content": "Another?"}]
    assert task_messages(later) == ask
    assert task_key(ask) == task_key(later), "a later call of the same run has the same task"
    assert task_key(ask) == task_key([dict(m, extra_field=1) for m in ask]), "bookkeeping fields do not matter"
    assert task_key(ask) != task_key(ask[:1] + [{"role": "user", "content": "Name a fruit."}])
    tool = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    assert task_key(ask) != task_key(ask, tool), "the same messages with tools are another task"


def test_client_group_id_wins_over_the_task_and_tenants_never_mix():
    members = [
        member("a", 1, task="x", group="g1"),
        member("b", 0, task="y", group="g1"),
        member("c", 1, task="x"),
        member("d", 0, task="x"),
        member("e", 1, task="x", tenant="other"),
        member("f", 0, task="x", tenant="other"),
    ]
    grouping = make_groups(members, min_group_size=2, now=100.0)
    groups = {tuple(m.trajectory_id for m in g.members) for g in grouping.usable}
    assert groups == {("a", "b"), ("c", "d"), ("e", "f")}
    assert group_key(members[0]) != group_key(members[2])


def test_equal_rewards_greedy_and_too_small_groups_are_set_aside_and_counted():
    members = [
        member("u1", 1, task="useful"),
        member("u2", 0, task="useful"),
        member("u3", 0.5, task="useful"),
        member("e1", 1, task="equal"),
        member("e2", 1, task="equal"),
        member("e3", 1, task="equal"),
        member("g1", 1, task="greedy", greedy=True),
        member("g2", 0, task="greedy", greedy=True),
        member("i1", 1, task="same", answer="42"),
        member("i2", 0, task="same", answer="42"),
        member("s1", 1, task="small"),
    ]
    grouping = make_groups(members, min_group_size=2, now=100.0)
    assert grouping.counts() == {
        "usable": 1,
        "pooled": 0,
        "equal_rewards": 1,
        "greedy": 2,
        "too_small": 1,
        "waiting": 0,
    }
    assert [m.trajectory_id for m in grouping.usable[0].members] == ["u1", "u2", "u3"]
    set_aside = {m.trajectory_id for g in grouping.set_aside() for m in g.members}
    assert set_aside == {"e1", "e2", "e3", "g1", "g2", "i1", "i2"}, "too-small groups stay for a later run"


def test_min_group_size_counts_rewarded_members():
    members = [member("a", 1), member("b", 0), member("c", 1)]
    assert make_groups(members, min_group_size=4, now=0).counts()["too_small"] == 1
    assert make_groups(members, min_group_size=3, now=0).counts()["usable"] == 1


def test_a_group_still_waiting_for_rewards_is_held_back_until_the_wait_is_over():
    members = [member("a", 1, at=100.0), member("b", 0, at=100.0), member("c", None, at=110.0)]
    assert make_groups(members, 2, now=150.0, reward_wait_s=60).counts()["waiting"] == 1
    late = make_groups(members, 2, now=171.0, reward_wait_s=60)
    assert late.counts()["usable"] == 1 and [m.trajectory_id for m in late.usable[0].members] == ["a", "b"]


def test_advantages_grpo_and_dr_grpo_against_hand_computed_values():
    rewards = [1.0, 0.0, 0.0, 1.0]
    # mean 0.5; sample std = sqrt((4 * 0.25) / 3) = 0.57735
    assert group_advantages(rewards, "grpo") == pytest.approx([0.866, -0.866, -0.866, 0.866], abs=1e-3)
    assert group_advantages(rewards, "dr_grpo") == pytest.approx([0.5, -0.5, -0.5, 0.5])
    assert group_advantages([2.0, 4.0, 9.0], "dr_grpo") == pytest.approx([-3.0, -1.0, 4.0])
    # std of [2, 4, 9] = sqrt((9 + 1 + 16) / 2) = 3.6056
    assert group_advantages([2.0, 4.0, 9.0], "grpo") == pytest.approx([-0.83205, -0.27735, 1.10940], abs=1e-4)
    assert group_advantages([3.0, 3.0], "grpo") == [0.0, 0.0]
    assert sum(group_advantages([0.3, 0.9, 0.1, 0.5], "grpo")) == pytest.approx(0.0, abs=1e-9)
