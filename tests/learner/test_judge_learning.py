"""The LLM judge closes the loop: a policy learns from the judge's scores alone, and a real model judges.

1. Learning from the judge alone. As tests/learner/test_learning.py (the real SmolLM2 behind
   `apprentice serve-model`, a real gateway, the openai client, `run_once` in-process each round,
   each candidate promoted through the admin API, held-out success straight at the server, base
   and final on the same prompts and seeds), but no webhook reward is ever posted: the policy's
   judge (mode "missing", so the learner's reward source is "webhook_else_judge") scores every
   group. The judge is the fake upstream's `judge-short10` (tests/support/fake_judge.py): 1 when
   an answer has at most 10 words, else 0. The prompt, "Describe X in a few words.", asks for
   brevity but never names a number: the rule lives only in the judge. (Measured, 80 samples:
   "Describe X briefly." meets 8 words 2.5% of the time and 10 words 14%; "in a few words" meets
   10 words 26%, enough for most groups of six to hold both outcomes from the first round.)

2. End-to-end wiring with the local SmolLM2 as the judge: the policy judges its own groups
   (judge.model is the policy), its calls going through the gateway to the same server. Whether
   a 135M model answers the judge's JSON is not asserted (it does not: `serve-model` accepts
   `response_format` and ignores it); every judgement must end (judged, or failed with a reason),
   be counted, and its scores (if any) stored as judge rewards; a learner run never reads the
   judge's own trajectories, even when a client rewards them as a group.

3. The judge's grouping (fast, against the fake upstream): members found quiet at different
   polls (late attempts, slow calls) end up scored by one judgement of the whole group, so the
   learner trains them as one GRPO group. Both tests above also hold the judge until their
   calls are recorded (JudgeHold), so that each round costs one judgement per group.
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.conftest import count_rows, wait_for
from tests.support.learning import (
    ALL_THINGS,
    BASE,
    EVAL_THINGS,
    LEARNING,
    POLICY,
    ROUNDS,
    SAMPLES_PER_TASK,
    TASKS_PER_ROUND,
    TRAIN_THINGS,
    Rounds,
    learning_policy,
    openai_client,
    round_seeds,
    round_things,
    success_rate,
)
from tests.support.learning import sample as sample_with

JUDGE_WORDS = 10  # the judge's rule, never shown to the policy
JUDGE_MODEL = f"judge-short{JUDGE_WORDS}"
EVAL_SEEDS = (11, 12)  # 80 held-out samples, twice test_learning's: less noise in base and final
# Measured after four rounds: final 0.925, 0.988, 0.912, 0.975, 0.700 and 0.575 (base 0.263-0.287):
# the server batches a round's 48 concurrent calls differently in every run, a batch's shape moves
# a logit enough to change a sampled token, and each run trains on other answers. Four rounds were
# too few to hold the margin every time; six are (see JUDGE_ROUNDS). A gain of 0.4 is learning
# beyond doubt.
MARGIN = 0.4
# Rounds 4 and 5 take prompts no other round and no evaluation uses (after EVAL_THINGS). A round
# whose every group is solved has nothing to teach and its run is skipped (Rounds.train_and_promote).
JUDGE_ROUNDS = ROUNDS + 2
EXTRA_THINGS = ALL_THINGS[len(TRAIN_THINGS) + len(EVAL_THINGS) :]
BUDGET_S = 600  # as test_learning; six rounds measured 104-113 s alone, 168 s in a clean-clone CI run
JUDGE_PREFIX = "apprentice-judge:"
JUDGE_WAIT_S = 1.0


def prompt(thing: str) -> str:
    return f"Describe {thing} in a few words."


def judged_success(text: str) -> float:
    """The judge's rule, made strict against the empty answer it would also accept: 1 to 10 words."""
    return 1.0 if 1 <= len(text.split()) <= JUDGE_WORDS else 0.0


def sample(client: Any, model: str, things: list[str], seeds: tuple[int, ...], *, raw: bool) -> list[dict[str, Any]]:
    """The harness's sampling with this module's prompt, scored by the judge's rule."""
    return sample_with(client, model, things, seeds, raw=raw, prompt_of=prompt, score=lambda t, _: judged_success(t))


def judge_round_things(round_number: int) -> list[str]:
    """The shared harness's rounds first, then TASKS_PER_ROUND things of EXTRA_THINGS per round."""
    if round_number < ROUNDS:
        return round_things(round_number)
    start = (round_number - ROUNDS) * TASKS_PER_ROUND
    things = EXTRA_THINGS[start : start + TASKS_PER_ROUND]
    assert len(things) == TASKS_PER_ROUND, "ALL_THINGS has too few prompts for JUDGE_ROUNDS"
    return things


def judgement_rows(db: Any, policy: str) -> list[dict[str, Any]]:
    cursor = db.execute(
        "SELECT id::text, status, reason, attempts, prompt_tokens, completion_tokens, judge_trajectory, "
        "trajectory_ids::text[] AS ids FROM judgements WHERE policy = %s ORDER BY started_at",
        (policy,),
    )
    names = [c.name for c in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def wait_judged(db: Any, policy: str, trajectory_ids: list[str], timeout: float) -> list[dict[str, Any]]:
    """Until every trajectory is in a finished judgement (judged or failed); returns those judgements."""
    wanted = set(trajectory_ids)
    deadline = time.monotonic() + timeout
    while True:
        rows = [r for r in judgement_rows(db, policy) if set(r["ids"]) & wanted]
        finished = [r for r in rows if r["status"] != "running"]
        covered = {i for r in finished for i in r["ids"]}
        if wanted <= covered:
            return finished
        if time.monotonic() > deadline:
            late = db.execute(
                "SELECT count(*), coalesce(max(extract(epoch FROM t.created_at - t.last_call_at)), 0), "
                "max(c.latency_ms) FROM trajectories t JOIN calls c ON c.trajectory_id = t.id "
                "WHERE t.id = ANY(%s::uuid[])",
                (list(wanted - covered),),
            ).fetchone()
            raise AssertionError(
                f"after {timeout}s, {len(wanted - covered)} of {len(wanted)} trajectories are in no finished "
                f"judgement ({late[0]} stored, recorded up to {late[1]:.1f}s after their call arrived, latency up "
                f"to {late[2]} ms); judgements (status, size, attempts): "
                f"{[(r['status'], len(r['ids']), r['attempts']) for r in rows]}"
            )
        time.sleep(0.2)


class JudgeHold:
    """Keeps a policy's judge from claiming groups until released: rows 'running' (as another
    gateway process's claims would be) that take its whole `concurrency`.

    Why: the judge takes each member once its call *arrived* wait_s ago, and judges the members
    it finds then, two or more, apart from those it finds later (the two xfail tests at the end).
    On two shared CPU cores a call of the local model takes from about a second to over a minute
    (up to 108 s measured, the machine loaded to 4.5), so a group of six is judged in pieces of
    two or three, each its own GRPO group below min_group_size (before 6d1255d, the pieces left
    out were never judged: seen with wait_s 1, 8, 12 and 25 s). Held while a round is sampled and
    released once every call is recorded and quiet, the judge sees whole groups; it still finds
    them, claims, calls the judge model and records the scores by itself.
    """

    def __init__(self, db: Any, policy: str, judge: dict[str, Any]) -> None:
        self.db, self.policy, self.judge = db, policy, judge
        self.ids: list[uuid.UUID] = []

    def __enter__(self) -> JudgeHold:
        self.ids = [uuid.uuid4() for _ in range(self.judge["concurrency"])]
        for index, judgement in enumerate(self.ids):
            self.db.execute(
                "INSERT INTO judgements (id, policy, tenant, group_key, chunk, members_key, judge_model, rubric_hash, "
                "mode, status, trajectory_ids, lease_until) VALUES (%s, %s, 'test-hold', %s, 0, %s, %s, 'test-hold', "
                "'manual', 'running', '{}', now() + interval '1 hour')",
                (judgement, self.policy, f"hold:{index}", f"hold:{judgement}", self.judge["model"]),
            )
        return self

    def release(self) -> None:
        if self.ids:
            self.db.execute("DELETE FROM judgements WHERE id = ANY(%s)", (self.ids,))
            self.ids = []

    def __exit__(self, *exc: Any) -> None:
        self.release()


def wait_quiet(db: Any, trajectory_ids: list[str], wait_s: float, timeout: float = 120) -> None:
    """Until every trajectory is recorded and its last call arrived more than wait_s ago."""
    wait_for(
        lambda: (
            count_rows(
                db,
                "SELECT count(*) FROM trajectories WHERE id = ANY(%s::uuid[]) "
                "AND last_call_at < now() - make_interval(secs => %s)",
                trajectory_ids,
                wait_s + 0.1,
            )
            == len(trajectory_ids)
        ),
        timeout=timeout,
        interval=0.2,
        message=f"{len(trajectory_ids)} trajectories recorded and quiet",
    )


def judge_entry(name: str, api_base: str) -> dict[str, Any]:
    return {"model_name": name, "litellm_params": {"model": f"openai/{name}", "api_base": api_base, "api_key": "sk-j"}}


@pytest.mark.learning
def test_the_policy_learns_from_the_judge_alone(
    model_server, start_gateway, fake_upstream, database_url, db, tmp_path, capsys
):
    import torch

    from apprentice.settings import Settings

    started = time.monotonic()
    torch.set_num_threads(2)
    judge = {
        "model": JUDGE_MODEL,
        "mode": "missing",
        "wait_s": JUDGE_WAIT_S,
        "poll_interval_s": 0.3,
        "max_group_size": SAMPLES_PER_TASK,
        "concurrency": 4,
    }
    policy = learning_policy(model_server.api_base, judge=judge)
    model_list = [judge_entry(JUDGE_MODEL, fake_upstream.api_base)]
    gateway = start_gateway(model_list=model_list, policies=[policy], adapter_poll_interval_s=0.2)
    through_gateway, direct = openai_client(gateway.base_url), openai_client(model_server.api_base)
    settings = Settings(
        database_url=database_url,
        data_dir=tmp_path / "learner",
        auth={"mode": "open"},
        model_list=model_list,
        policies=[policy],
    )
    assert settings.policies[0].reward_source == "webhook_else_judge"

    rounds = Rounds(settings, gateway, "judge learning test", started=started)
    base_results = sample(direct, BASE, EVAL_THINGS, EVAL_SEEDS, raw=False)
    base_rate = success_rate(base_results)
    rounds.mark("base eval")

    round_rates, solved_rounds = [], []
    for round_number in range(JUDGE_ROUNDS):
        with JudgeHold(db, POLICY, judge) as hold:
            things = judge_round_things(round_number)
            results = sample(through_gateway, POLICY, things, round_seeds(round_number), raw=True)
            ids = [r["trajectory_id"] for r in results]
            wait_quiet(db, ids, JUDGE_WAIT_S)
            hold.release()
        round_rates.append(success_rate(results))
        sampled_at = time.monotonic()
        judged = wait_judged(db, POLICY, ids, timeout=60)
        assert all(j["status"] == "judged" for j in judged), [j["reason"] for j in judged]
        assert len(judged) == TASKS_PER_ROUND, "one judgement per group (max_group_size = the group's size)"
        waited = time.monotonic() - sampled_at
        recorded = count_rows(db, "SELECT max(latency_ms) / 1000 FROM calls WHERE trajectory_id = ANY(%s::uuid[])", ids)
        if all(len({r["reward"] for r in results if r["thing"] == thing}) == 1 for thing in things):
            solved_rounds.append(round_number)  # every group's answers scored alike: nothing to learn
        outcome = rounds.train_and_promote(
            round_number,
            f"rate {round_rates[-1]:.2f} calls answered in <= {recorded:.1f}s, judged {waited:.1f}s after recorded",
            may_be_solved=True,
        )
        rounds.timeline[-1] += f" groups {outcome.metrics.get('reward_sources')}"

    final = rounds.final
    final_results = sample(direct, final, EVAL_THINGS, EVAL_SEEDS, raw=False)
    final_rate = success_rate(final_results)
    elapsed = rounds.elapsed

    def ended(results: list[dict[str, Any]]) -> float:  # the answer also ended by itself
        return sum(r["reward"] for r in results if r["finish_reason"] == "stop") / len(results)

    runs = db.execute(
        "SELECT status, trajectories, groups, groups_equal_rewards, metrics->>'reward_source', "
        "metrics->'reward_sources' FROM training_runs ORDER BY started_at"
    ).fetchall()
    with capsys.disabled():
        print(
            f"\njudge learning test: base {base_rate:.3f} -> {final} {final_rate:.3f} on {len(base_results)} samples "
            f"of {len(EVAL_THINGS)} fresh prompts (ended by itself: {ended(base_results):.3f} -> "
            f"{ended(final_results):.3f}); rounds {[round(r, 2) for r in round_rates]}; {elapsed:.0f}s"
        )
        print("  " + "; ".join(rounds.timeline))
        for run in runs:
            print("  run", run)

    # Every run trained on the judge's scores, and only on them: no webhook reward exists. A run
    # was skipped only where every group of its round had scored alike.
    assert len(runs) == JUDGE_ROUNDS
    assert set(rounds.skipped) <= set(solved_rounds), (rounds.skipped, solved_rounds)
    assert [run[0] for run in runs] == [
        "skipped" if number in rounds.skipped else "succeeded" for number in range(JUDGE_ROUNDS)
    ]
    assert len(rounds.outcomes) >= ROUNDS, "most rounds train"
    for run in runs:
        if run[0] == "skipped":
            continue
        assert run[4] == "webhook_else_judge"
        assert run[5]["webhook"] == 0 and run[5]["judge"] >= 1, run
    assert count_rows(db, "SELECT count(*) FROM rewards WHERE source IS DISTINCT FROM 'judge'") == 0
    assert count_rows(db, "SELECT count(*) FROM rewards WHERE name <> 'judge'") == 0
    sampled = JUDGE_ROUNDS * TASKS_PER_ROUND * SAMPLES_PER_TASK
    assert count_rows(db, "SELECT count(*) FROM rewards WHERE judgement_id IS NOT NULL AND status = 'linked'") == (
        sampled
    )

    # The judge's calls went through the gateway, under their own trajectories, never trained on.
    judgements = judgement_rows(db, POLICY)
    judge_trajectories = db.execute(
        "SELECT client_trajectory_id, policy, trained_in_run_id FROM trajectories WHERE starts_with("
        "client_trajectory_id, %s)",
        (JUDGE_PREFIX,),
    ).fetchall()
    assert {t[0] for t in judge_trajectories} == {j["judge_trajectory"] for j in judgements}
    assert all(t[2] is None for t in judge_trajectories)
    assert all(j["status"] == "judged" and j["attempts"] == 1 for j in judgements)

    # The loop ran as production would: each round after a trained one served by the new adapter.
    served = count_rows(
        db,
        "SELECT count(DISTINCT adapter_version_id) FROM calls WHERE policy = %s AND adapter_version_id IS NOT NULL",
        POLICY,
    )
    assert served == sum(1 for number in range(JUDGE_ROUNDS - 1) if number not in rounds.skipped)

    assert len(EVAL_THINGS) >= 32 and not set(EVAL_THINGS) & set(TRAIN_THINGS)
    assert final_rate >= base_rate + MARGIN, (base_rate, final_rate)
    assert elapsed < BUDGET_S, f"the judge learning test took {elapsed:.0f}s"


@pytest.mark.learning
def test_the_local_model_judges_its_own_groups_through_the_gateway(
    model_server, start_gateway, database_url, db, tmp_path, capsys
):
    """SmolLM2 as the judge of its own policy: wiring only, the quality of its scores is not asserted."""
    import torch

    from apprentice.settings import Settings
    from learner.jobs.run import run_once

    torch.set_num_threads(2)
    started = time.monotonic()
    groups, size, max_attempts = 1, 3, 1  # the wiring, not the quality: kept short on a CPU
    judge = {
        "model": POLICY,  # the policy judges itself: its judge calls are the policy's calls too
        "mode": "missing",
        "wait_s": JUDGE_WAIT_S,
        "poll_interval_s": 0.3,
        "max_group_size": size,
        "concurrency": groups,
        "max_attempts": max_attempts,
        "max_tokens": 96,  # enough for the start of an answer; a 135M model does not finish one anyway
    }
    policy = {
        "name": POLICY,
        "base_model": BASE,
        "endpoints": [model_server.api_base],
        "temperature": 1.0,
        "learning": {**LEARNING, "min_group_size": 2},
        "judge": judge,
    }
    gateway = start_gateway(model_list=[], policies=[policy])
    through_gateway = openai_client(gateway.base_url)
    with JudgeHold(db, POLICY, judge) as hold:  # whole groups only (see JudgeHold)
        results = sample(through_gateway, POLICY, TRAIN_THINGS[:groups], tuple(range(size)), raw=True)
        ids = {r["trajectory_id"] for r in results}
        wait_quiet(db, list(ids), JUDGE_WAIT_S)
        hold.release()
    judgements = wait_judged(db, POLICY, list(ids), timeout=300)
    judging_s = time.monotonic() - started
    wait_for(
        lambda: (
            count_rows(
                db,
                "SELECT count(*) FROM calls c JOIN trajectories t ON t.id = c.trajectory_id "
                "WHERE starts_with(t.client_trajectory_id, %s)",
                JUDGE_PREFIX,
            )
            >= sum(j["attempts"] for j in judgements)
        ),
        message="the judge's calls recorded",
    )
    calls = db.execute(
        "SELECT t.client_trajectory_id, t.policy, c.model, c.status_code, c.temperature, "
        "c.response->'choices'->0->'message'->>'content', c.request->'response_format'->>'type' "
        "FROM calls c JOIN trajectories t ON t.id = c.trajectory_id "
        "WHERE starts_with(t.client_trajectory_id, %s) ORDER BY c.created_at",
        (JUDGE_PREFIX,),
    ).fetchall()
    with capsys.disabled():
        print(f"\nSmolLM2 as its own judge: {judging_s:.0f}s to finish {len(judgements)} judgements")
        for j in judgements:
            print(
                f"  {j['status']} attempts {j['attempts']} tokens {j['prompt_tokens']}+{j['completion_tokens']} "
                f"reason {j['reason']!r}"
            )
        for call in calls:
            print(f"  judge call status {call[3]} temperature {call[4]} answered {(call[5] or '')[:160]!r}")
    assert calls and all(call[4] == 0.0 for call in calls), "judge calls keep the judge's temperature, not the policy's"

    # Each group was judged once (one chunk), and every judgement ended, counted.
    assert len(judgements) == groups and {frozenset(j["ids"]) for j in judgements} == {
        frozenset(r["trajectory_id"] for r in results if r["thing"] == thing) for thing in TRAIN_THINGS[:groups]
    }
    for j in judgements:
        assert j["status"] in ("judged", "failed"), j
        assert 1 <= j["attempts"] <= max_attempts, j
        assert j["prompt_tokens"] > 0 and j["completion_tokens"] > 0, j
        assert (j["status"] == "failed") == (j["reason"] is not None), j
        assert j["status"] == "judged" or j["attempts"] == max_attempts, j

    # The judge's calls went through the gateway to the policy, one per attempt, each under its
    # judgement's client trajectory id, asking for the JSON schema.
    assert len(calls) == sum(j["attempts"] for j in judgements)
    assert {c[0] for c in calls} == {j["judge_trajectory"] for j in judgements}
    assert all(c[1] == POLICY and c[2] == POLICY and c[3] == 200 and c[6] == "json_schema" for c in calls)

    # Scores became judge rewards for exactly the judged groups' trajectories.
    rewards = db.execute(
        "SELECT trajectory_id::text, value, judgement_id::text FROM rewards "
        "WHERE source = 'judge' AND status = 'linked' AND superseded_at IS NULL"
    ).fetchall()
    judged = {i: j["id"] for j in judgements if j["status"] == "judged" for i in j["ids"]}
    assert {r[0]: r[2] for r in rewards} == judged and len(rewards) == len(judged)
    assert all(0.0 <= r[1] <= 1.0 for r in rewards)

    # A learner run never trains on the judge's own trajectories, even when a client rewards them
    # as a group with different values (which would train, were they the policy's work).
    judge_trajectories = [
        r[0]
        for r in db.execute(
            "SELECT id::text FROM trajectories WHERE starts_with(client_trajectory_id, %s)", (JUDGE_PREFIX,)
        ).fetchall()
    ]
    for index, trajectory_id in enumerate(judge_trajectories):
        answer = httpx.post(
            f"{gateway.base_url}/rewards",
            json={"trajectory_id": trajectory_id, "reward": float(index % 2), "group_id": "the-judge-calls"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
    wait_for(
        lambda: (
            count_rows(
                db,
                "SELECT count(*) FROM rewards WHERE trajectory_id = ANY(%s::uuid[]) AND status = 'linked'",
                judge_trajectories,
            )
            == len(judge_trajectories)
        ),
        message="rewards on the judge's trajectories linked",
    )
    settings = Settings(
        database_url=database_url, data_dir=tmp_path / "learner", auth={"mode": "open"}, policies=[policy]
    )
    outcome = run_once(settings, POLICY, trigger="test-judge-wiring")
    with capsys.disabled():
        print(f"  run_once: {outcome.status} {outcome.error or ''} {outcome.metrics.get('reward_sources')}")
    assert outcome.status in ("succeeded", "skipped"), (outcome.status, outcome.error)
    assert outcome.metrics["candidates"] == len(judged), "only the policy's judged trajectories were read"
    trained = db.execute("SELECT id::text FROM trajectories WHERE trained_in_run_id IS NOT NULL").fetchall()
    assert {t[0] for t in trained} <= ids
    assert not {t[0] for t in trained} & set(judge_trajectories)
    if any(len({r[1] for r in rewards if r[0] in j["ids"]}) > 1 for j in judgements):
        assert outcome.status == "succeeded" and outcome.metrics["reward_sources"]["judge"] >= 1


# ---- the judge's grouping: a group's current judge scores come from one judgement ---------------
# docs/judge.md ("How a group is judged") and migration 0008: a group with new members is judged
# again as a whole, and its members' newer scores replace the older ones. The learner relies on
# it: judge-scored members train in one GRPO group per judgement, so scores from several
# judgements would train as several smaller groups, each dropped below learning.min_group_size.


def _agent_gateway(start_gateway: Any, api: str) -> Any:
    agent = {"model_name": "agent", "litellm_params": {"model": "openai/fake-model", "api_base": api, "api_key": "k"}}
    return start_gateway(
        model_list=[agent, judge_entry("judge-length", api)],
        policies=[
            {
                "name": "agent",
                "base_model": "fake-base",
                "learning": {"enabled": False},
                "judge": {"model": "judge-length", "wait_s": 1.0, "poll_interval_s": 0.2},
            }
        ],
    )


def _attempt(client: Any, slow: bool = False) -> str:
    """One attempt at the same task; a slow one streams its answer for about 4 s."""
    messages = [{"role": "user", "content": "Summarise ticket 12."}]
    if not slow:
        return client.chat.completions.with_raw_response.create(model="agent", messages=messages).headers[
            "x-trajectory-id"
        ]
    with client.chat.completions.with_streaming_response.create(
        model="agent",
        messages=messages,
        stream=True,
        extra_body={"fake_stream": {"chunks": 20, "chunk_delay_ms": 200}},
    ) as response:
        trajectory = response.headers["x-trajectory-id"]
        for _ in response.iter_lines():
            pass
    return trajectory


def _current_judgements(db: Any, ids: list[str]) -> set[str]:
    """The judgements the members' current judge scores come from, once every member has one."""

    def scored() -> list[tuple[str, str]] | None:
        rows = db.execute(
            "SELECT trajectory_id::text, judgement_id::text FROM rewards WHERE trajectory_id = ANY(%s::uuid[]) "
            "AND name = 'judge' AND status = 'linked' AND superseded_at IS NULL",
            (ids,),
        ).fetchall()
        return rows if {r[0] for r in rows} == set(ids) else None

    rows = wait_for(scored, timeout=20, interval=0.2, message="every member scored by the judge")
    time.sleep(1.5)  # a few more polls: a re-judging of the whole group would land now
    return {r[1] for r in scored() or rows}


def test_late_attempts_are_judged_with_their_group(start_gateway, fake_upstream, db):
    import openai

    client = openai.OpenAI(base_url=_agent_gateway(start_gateway, fake_upstream.api_base).base_url, api_key="x")
    first = [_attempt(client), _attempt(client)]
    wait_judged(db, "agent", first, timeout=20)
    late = [_attempt(client), _attempt(client)]  # two more attempts at the task, after it was judged
    assert len(_current_judgements(db, first + late)) == 1


def test_attempts_sent_together_are_judged_together(start_gateway, fake_upstream, db):
    """Readiness counts from each call's *arrival* (trajectories.last_call_at), and a call in
    flight is not in the database at all: the fast attempts are judged before the slow ones exist."""
    import openai

    client = openai.OpenAI(base_url=_agent_gateway(start_gateway, fake_upstream.api_base).base_url, api_key="x")
    with ThreadPoolExecutor(4) as pool:
        ids = list(pool.map(lambda slow: _attempt(client, slow), [True, True, False, False]))
    assert len(_current_judgements(db, ids)) == 1
