"""The LLM judge (gateway/judging): answers validated and retried, budget, idempotency, the
shared prefix read once, scores stored as rewards, and `apprentice judge`.

The judge is the fake upstream's `judge-<rule>[-<fault><k>]` models (tests/support/fake_judge.py),
called through a real gateway by its judge worker, as in production.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from typing import Any

import httpx
import openai
import pytest

from gateway.judging.answer import InvalidAnswer, parse_answer
from gateway.judging.transcript import Transcript, conversation, judge_prompt, split_shared_prefix
from tests.conftest import count_rows, wait_for
from tests.support.fake_judge import judge_content

SYSTEM = "You are a support agent for ACME. Answer in one sentence."
LABELS = ["t1", "t2", "t3"]


# ---- answer validation (pure) -------------------------------------------------------------
def _good(**overrides: Any) -> str:
    import json

    entries = [{"trajectory_id": label, "explanation": "ok", "score": 0.5} for label in LABELS]
    entries[0].update(overrides)
    return json.dumps({"scores": entries})


def test_a_well_formed_answer_is_read():
    scores = parse_answer(_good(score=1), LABELS)
    assert {label: s.score for label, s in scores.items()} == {"t1": 1.0, "t2": 0.5, "t3": 0.5}
    assert scores["t1"].explanation == "ok"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("I think t1 is best.", "not JSON"),
        ("", "empty"),
        ('{"scores": [{"trajectory_id": "t1", "explanation": "", "score": 1}]}', "no score for: t2, t3"),
        (_good().replace('"t1"', '"t9"'), "unknown trajectory ids: t9"),
        (_good().replace('"score": 0.5', '"score": NaN', 1), "not a finite number"),
        (_good().replace('"score": 0.5', '"score": Infinity', 1), "not a finite number"),
        (_good().replace('"score": 0.5', '"score": 1e400', 1), "not finite"),
        (_good(score=1.5), "outside [0, 1]"),
        (_good(score=-0.1), "outside [0, 1]"),
        (_good(score=True), "not a number"),
        (_good(score="0.9"), "not a number"),
        ('{"scores": "all good"}', '"scores" list'),
        ('[{"trajectory_id": "t1", "score": 1}]', '"scores" list'),
    ],
)
def test_a_malformed_answer_is_refused_with_the_reason(text: str, reason: str):
    with pytest.raises(InvalidAnswer, match=reason.replace("[", r"\[").replace("]", r"\]")):
        parse_answer(text, LABELS)


def test_an_id_scored_twice_is_refused():
    import json

    doubled = json.loads(_good())
    doubled["scores"].append(doubled["scores"][0])
    with pytest.raises(InvalidAnswer, match="scored twice"):
        parse_answer(json.dumps(doubled), LABELS)


def test_an_answer_in_a_code_fence_is_accepted():
    scores = parse_answer("Scores:\n```json\n" + _good(score=0.25) + "\n```\nDone.", LABELS)
    assert math.isclose(scores["t1"].score, 0.25)


# ---- transcripts and the shared prefix (pure) ---------------------------------------------
def _call(messages: list[dict[str, Any]], answer: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    return {"messages": messages}, {"choices": [{"message": {"role": "assistant", **answer}}]}


def test_a_multi_call_trajectory_becomes_one_conversation_with_its_tool_calls_and_results():
    task = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Weather in Paris?"}]
    tool_call = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
    first = _call(task, {"content": None, "tool_calls": [tool_call]})
    history = [
        *task,
        {"role": "assistant", "content": None, "tool_calls": [tool_call]},
        {"role": "tool", "tool_call_id": "c1", "content": "18 C, sunny"},
    ]
    second = _call(history, {"content": "It is 18 C and sunny."})
    shown = conversation([first, second])
    assert shown == [
        ("system", SYSTEM),
        ("user", "Weather in Paris?"),
        ("assistant", 'call weather({"city": "Paris"})'),
        ("tool result", "18 C, sunny"),
        ("assistant", "It is 18 C and sunny."),
    ]


def test_the_judge_prompt_holds_the_shared_prefix_once():
    task = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Reset my password."}]
    answers = ["Click 'forgot password'.", "I cannot help.", "Contact support at help@acme.test."]
    transcripts = [
        Transcript(f"t{i + 1}", f"id-{i}", conversation([_call(task, {"content": a})])) for i, a in enumerate(answers)
    ]
    shared, rest = split_shared_prefix(transcripts)
    assert shared == [("system", SYSTEM), ("user", "Reset my password.")]
    assert [t.messages for t in rest] == [[("assistant", a)] for a in answers]
    prompt = judge_prompt("Rubric text.", transcripts)
    text = prompt[1]["content"]
    assert text.count(SYSTEM) == 1 and text.count("Reset my password.") == 1
    assert all(text.count(a) == 1 for a in answers)
    assert 'id="t1"' in text and 'id="t3"' in text and "t1, t2, t3" in prompt[0]["content"]


def test_identical_trajectories_keep_their_last_message():
    same = conversation([_call([{"role": "user", "content": "hi"}], {"content": "hello"})])
    shared, rest = split_shared_prefix([Transcript("t1", "a", same), Transcript("t2", "b", same)])
    assert shared == [("user", "hi")] and all(t.messages == [("assistant", "hello")] for t in rest)


def test_the_fake_judge_reads_the_prompt_the_gateway_writes():
    task = [{"role": "user", "content": "Say hi."}]
    transcripts = [
        Transcript("t1", "a", conversation([_call(task, {"content": "hi"})])),
        Transcript("t2", "b", conversation([_call(task, {"content": "Hello There"})])),
    ]
    body = {"model": "judge-lowercase", "messages": judge_prompt("r", transcripts)}
    assert {s.label: s.score for s in parse_answer(judge_content(body), ["t1", "t2"]).values()} == {
        "t1": 1.0,
        "t2": 0.0,
    }


# ---- through a real gateway ---------------------------------------------------------------
def _policy(name: str, judge_model: str, **judge: Any) -> dict[str, Any]:
    return {
        "name": name,
        "base_model": "fake-base",
        "learning": {"enabled": False, "reward_wait_s": 0.3},
        "judge": {"model": judge_model, "poll_interval_s": 0.2, "max_attempts": 3, **judge},
    }


def _entry(name: str, api_base: str) -> dict[str, Any]:
    return {
        "model_name": name,
        "litellm_params": {"model": "openai/fake-model", "api_base": api_base, "api_key": "sk-upstream-secret"},
    }


def _judge_entry(name: str, api_base: str) -> dict[str, Any]:
    return {"model_name": name, "litellm_params": {"model": f"openai/{name}", "api_base": api_base, "api_key": "sk-j"}}


def _run_group(client: openai.OpenAI, model: str, task: str, size: int = 3, group: str | None = None) -> list[str]:
    """`size` attempts at one task (same messages, different answers); returns their trajectory ids."""
    ids = []
    for seed in range(size):
        headers = {"X-Group-Id": group} if group else {}
        raw = client.chat.completions.with_raw_response.create(
            model=model,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}],
            seed=seed * 7,
            extra_headers=headers,
        )
        ids.append(raw.headers["x-trajectory-id"])
    return ids


def _judgements(db, policy: str) -> list[dict[str, Any]]:
    cursor = db.execute(
        "SELECT id, status, reason, attempts, prompt_tokens, completion_tokens, judge_trajectory, "
        "trajectory_ids::text[] AS ids FROM judgements WHERE policy = %s ORDER BY started_at",
        (policy,),
    )
    names = [c.name for c in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _finished(db, policy: str, count: int = 1) -> list[dict[str, Any]]:
    def done() -> list[dict[str, Any]] | None:
        rows = _judgements(db, policy)
        return rows if len(rows) >= count and all(r["status"] != "running" for r in rows) else None

    return wait_for(done, timeout=40, message=f"{count} finished judgement(s) of {policy}")


def test_groups_are_judged_once_through_the_gateway_and_scores_become_rewards(start_gateway, fake_upstream, db):
    api = fake_upstream.api_base
    gateway = start_gateway(
        workers=2,
        model_list=[_entry("agent", api), _judge_entry("judge-length", api)],
        policies=[_policy("agent", "judge-length", max_group_size=4)],
    )
    client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
    httpx.delete(f"http://127.0.0.1:{fake_upstream.port}/_requests")
    ids = _run_group(client, "agent", "Where is my parcel 4711?", size=3)
    large = _run_group(client, "agent", "Cancel order 99.", size=6)
    everyone = set(ids) | set(large)

    def all_scored() -> list[dict[str, Any]] | None:
        rows = _judgements(db, "agent")
        scored = count_rows(
            db,
            "SELECT count(DISTINCT trajectory_id) FROM rewards WHERE name = 'judge' AND status = 'linked' "
            "AND superseded_at IS NULL",
        )
        return rows if scored == 9 and rows and all(r["status"] != "running" for r in rows) else None

    # Members are judged as they become quiet, at most max_group_size (4) at a time, never across
    # groups; a lone late member is judged with anchors from its group.
    rows = wait_for(all_scored, timeout=40, message="every trajectory scored by the judge")
    assert set().union(*(set(r["ids"]) for r in rows)) == everyone
    assert all(set(r["ids"]) <= set(ids) or set(r["ids"]) <= set(large) for r in rows), "groups never mix"
    assert all(2 <= len(r["ids"]) <= 4 for r in rows)
    assert all(r["status"] == "judged" and r["attempts"] == 1 and r["prompt_tokens"] > 0 for r in rows)
    judged = len(rows)

    rewards = db.execute(
        "SELECT r.trajectory_id::text, r.value, r.source, r.comment, r.judgement_id::text, j.judge_model "
        "FROM rewards r JOIN judgements j ON j.id = r.judgement_id "
        "WHERE r.name = 'judge' AND r.status = 'linked' AND r.superseded_at IS NULL"
    ).fetchall()
    assert len(rewards) == 9 and {r[0] for r in rewards} == everyone
    assert all(r[2] == "judge" and r[5] == "judge-length" and r[3].startswith("length:") for r in rewards)
    assert all(0.0 <= r[1] <= 1.0 for r in rewards) and max(r[1] for r in rewards) == 1.0

    # The judge's calls went through the gateway: recorded under its own client trajectory ids,
    # and the prompt held the shared system prompt once.
    wait_for(lambda: count_rows(db, "SELECT count(*) FROM calls WHERE model = 'judge-length'") == judged)
    judge_calls = db.execute(
        "SELECT t.client_trajectory_id, c.request FROM calls c JOIN trajectories t ON t.id = c.trajectory_id "
        "WHERE c.model = 'judge-length'"
    ).fetchall()
    assert {c[0] for c in judge_calls} == {r["judge_trajectory"] for r in rows}
    assert all(c[0].startswith("apprentice-judge:") for c in judge_calls)
    for _, request in judge_calls:
        prompt = request["messages"][1]["content"]
        assert prompt.count(SYSTEM) == 1 and prompt.count("<attempt id=") >= 2
        assert request["response_format"]["type"] == "json_schema"

    # Idempotent: more polls (two processes) judge nothing again.

    time.sleep(1.5)
    assert len(_judgements(db, "agent")) == judged
    requests = httpx.get(f"http://127.0.0.1:{fake_upstream.port}/_requests").json()["requests"]
    assert len([r for r in requests if r["model"] == "judge-length"]) == judged

    status = httpx.get(gateway.url + "/v1/admin/policies/agent/judge").json()
    assert status["judgements"] == {"running": 0, "judged": judged, "failed": 0}
    assert status["judge"]["model"] == "judge-length" and status["reward_source"] == "webhook_else_judge"
    assert status["budget"]["calls_used"] == judged and status["budget"]["exhausted"] is False


FAULTS = {
    # policy suffix: (judge model, expected status, expected attempts, reason fragment)
    "notjson": ("judge-length-notjson", "failed", 3, "not JSON"),
    "missing": ("judge-length-missing", "failed", 3, "no score for: t1"),
    "extra": ("judge-length-extra", "failed", 3, "unknown trajectory ids: t99"),
    "nan": ("judge-length-nan", "failed", 3, "not a finite number"),
    "range": ("judge-length-range", "failed", 3, "outside [0, 1]"),
    "duplicate": ("judge-length-duplicate", "failed", 3, "scored twice"),
    "bool": ("judge-length-bool", "failed", 3, "not a number"),
    "retried": ("judge-length-nan2", "judged", 3, None),
    "fenced": ("judge-length-fenced", "judged", 1, None),
    "unroutable": ("judge-length-down", "failed", 3, "judge call failed with HTTP"),
}


def test_malformed_answers_are_retried_then_recorded_as_not_judged(start_gateway, fake_upstream, db):
    api = fake_upstream.api_base
    model_list = []
    policies = []
    for suffix, (judge_model, *_rest) in FAULTS.items():
        model_list.append(_entry(f"agent-{suffix}", api))
        if suffix == "unroutable":  # a judge deployment whose upstream answers 503
            model_list.append(
                {"model_name": judge_model, "litellm_params": {"model": "openai/fail-503", "api_base": api}}
            )
        else:
            model_list.append(_judge_entry(judge_model, api))
        policies.append(_policy(f"agent-{suffix}", judge_model, mode="always"))
    gateway = start_gateway(model_list=model_list, policies=policies)
    client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
    trajectories = {suffix: _run_group(client, f"agent-{suffix}", "Say something.", size=2) for suffix in FAULTS}
    for suffix, (_model, status, attempts, reason) in FAULTS.items():
        (row,) = _finished(db, f"agent-{suffix}")
        assert (row["status"], row["attempts"]) == (status, attempts), (suffix, row)
        if reason:
            assert reason in row["reason"], (suffix, row["reason"])
        stored = count_rows(db, "SELECT count(*) FROM rewards WHERE judgement_id = %s AND status = 'linked'", row["id"])
        assert stored == (2 if status == "judged" else 0), suffix
        assert set(row["ids"]) == set(trajectories[suffix])
    status = httpx.get(gateway.url + "/v1/admin/policies/agent-notjson/judge").json()
    assert status["judgements"]["failed"] == 1
    assert "not JSON" in status["recent_failures"][0]["reason"]
    # A retry tells the judge what was wrong with its previous answer.
    retried = db.execute(
        "SELECT c.request FROM calls c JOIN trajectories t ON t.id = c.trajectory_id "
        "WHERE c.model = 'judge-length-nan2' ORDER BY c.created_at DESC LIMIT 1"
    ).fetchone()[0]
    assert [m["role"] for m in retried["messages"]][-2:] == ["assistant", "user"]
    assert "not a finite number" in retried["messages"][-1]["content"]


def test_mode_missing_skips_groups_whose_rewards_all_arrived(start_gateway, fake_upstream, db):
    api = fake_upstream.api_base
    gateway = start_gateway(
        model_list=[_entry("agent", api), _judge_entry("judge-length", api)],
        policies=[_policy("agent", "judge-length", mode="missing", wait_s=1.5)],
    )
    client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
    rewarded = _run_group(client, "agent", "Task A", size=2)
    partly = _run_group(client, "agent", "Task B", size=2)
    for trajectory_id in [*rewarded, partly[0]]:
        response = httpx.post(gateway.url + "/v1/rewards", json={"trajectory_id": trajectory_id, "reward": 1.0})
        assert response.status_code == 200, response.text
    (row,) = _finished(db, "agent")
    assert set(row["ids"]) == set(partly)

    time.sleep(1.0)
    assert len(_judgements(db, "agent")) == 1


def test_over_the_budget_judging_waits_and_says_so(start_gateway, fake_upstream, db):
    api = fake_upstream.api_base
    gateway = start_gateway(
        model_list=[_entry("agent", api), _judge_entry("judge-length", api)],
        policies=[_policy("agent", "judge-length", mode="always", budget={"calls_per_hour": 2})],
    )
    client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
    for task in ("Task 1", "Task 2", "Task 3"):
        _run_group(client, "agent", task, size=2)
    _finished(db, "agent", count=2)

    def exhausted() -> dict[str, Any] | None:
        status = httpx.get(gateway.url + "/v1/admin/policies/agent/judge").json()
        return status if status["budget"]["exhausted"] else None

    status = wait_for(exhausted, message="the budget reported exhausted")
    assert status["budget"]["calls_used"] == 2 and status["budget"]["calls_per_hour"] == 2
    assert status["budget"]["resumes_at"] is not None

    def gauge() -> bool:
        text = httpx.get(gateway.url + "/metrics").text
        return 'apprentice_judge_budget_exhausted{policy="agent"} 1.0' in text

    wait_for(gauge, message="the budget gauge at 1")

    time.sleep(1.0)
    assert len(_judgements(db, "agent")) == 2  # the third group waits


def test_the_judge_command_judges_one_group_and_prints_its_scores(start_gateway, fake_upstream, db):
    api = fake_upstream.api_base
    # The worker would judge the group on its own; a long wait keeps it away so the command does.
    gateway = start_gateway(
        model_list=[_entry("agent", api), _judge_entry("judge-length", api)],
        policies=[_policy("agent", "judge-length", wait_s=3600)],
    )
    client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
    ids = _run_group(client, "agent", "Summarise ticket 12.", size=3, group="ticket-12")
    wait_for(lambda: count_rows(db, "SELECT count(*) FROM trajectories WHERE group_id = 'ticket-12'") == 3)
    command = [
        sys.executable,
        "-m",
        "apprentice.cli",
        "judge",
        "--config",
        str(gateway.config_path),
        "--policy",
        "agent",
    ]
    # The command calls the judge through the gateway at the configured address.
    env = {**os.environ, "APPRENTICE_PORT": str(gateway.port)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*command, *args], capture_output=True, text=True, timeout=60, env=env)

    dry = run("--group", ids[1], "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "dry run" in dry.stdout and all(i in dry.stdout for i in ids)
    assert count_rows(db, "SELECT count(*) FROM judgements") == 0
    first = run("--group", "ticket-12")
    assert first.returncode == 0, first.stderr
    assert "judged" in first.stdout and "score 1.000" in first.stdout
    assert count_rows(db, "SELECT count(*) FROM rewards WHERE source = 'judge'") == 3
    again = run("--group", "ticket-12")
    assert again.returncode == 0 and "already judged" in again.stdout
    assert count_rows(db, "SELECT count(*) FROM judgements") == 1
    missing = run("--group", "no-such-group")
    assert missing.returncode != 0 and "no group 'no-such-group'" in missing.stderr


def test_a_group_whose_members_arrive_one_by_one_puts_each_before_the_judge_at_most_twice(
    start_gateway, fake_upstream, db
):
    """16 attempts at one task, each quiet before the next arrives: each member appears in at
    most 2 judge calls (re-judging the whole group at each arrival put the first member in 15),
    and every member ends with a current judge score."""
    api = fake_upstream.api_base
    gateway = start_gateway(
        model_list=[_entry("trickle", api), _judge_entry("judge-length", api)],
        policies=[_policy("trickle", "judge-length", max_group_size=8)],
    )
    client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
    httpx.delete(f"http://127.0.0.1:{fake_upstream.port}/_requests")
    members = []
    for seed in range(16):
        raw = client.chat.completions.with_raw_response.create(
            model="trickle",
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Refund order 7."}],
            seed=seed * 7,
        )
        members.append(raw.headers["x-trajectory-id"])
        # quiet (reward_wait_s 0.3) and judged before the next one arrives (a group of one is not judged)
        if seed:
            wait_for(
                lambda newest=members[-1]: [
                    r for r in _judgements(db, "trickle") if newest in r["ids"] and r["status"] != "running"
                ],
                timeout=20,
                message=f"member {seed} judged",
            )

    def all_scored() -> list[dict[str, Any]] | None:
        rows = _judgements(db, "trickle")
        scored = count_rows(
            db,
            "SELECT count(DISTINCT trajectory_id) FROM rewards WHERE name = 'judge' AND status = 'linked' "
            "AND superseded_at IS NULL",
        )
        return rows if scored == 16 and all(r["status"] != "running" for r in rows) else None

    rows = wait_for(all_scored, timeout=60, message="every member scored by the judge")
    appearances = {member: sum(member in r["ids"] for r in rows) for member in members}
    judge_calls = len(
        [
            r
            for r in httpx.get(f"http://127.0.0.1:{fake_upstream.port}/_requests").json()["requests"]
            if r["model"] == "judge-length"
        ]
    )
    print(
        f"16 members one by one: {judge_calls} judge calls, {sum(appearances.values())} member-judgings, "
        f"most for one member {max(appearances.values())}"
    )
    assert set(appearances) == set(members) and all(1 <= n <= 2 for n in appearances.values()), appearances
    assert judge_calls == len(rows) <= 2 * 16
