"""The product loop learns: SmolLM2-135M-Instruct gets better at a verifiable task from its own traffic.

Real processes throughout: `apprentice serve-model` (the real SmolLM2) is the policy's endpoint
behind a real gateway; the official openai client sends the calls (a fixed seed each, so the run
is reproducible); rewards arrive through the signed webhook a few seconds late, shuffled, and one
group's rewards only after the learner has run (stale data for the next round, sampled by an
older adapter); the learner runs in-process (`run_once`, as `apprentice learn` does);
each candidate is promoted through the admin API, which loads it into the server, and the
gateway then routes the policy's calls to it (on-policy rounds).

The task: "Describe X in 8 words or fewer." Reward 1 when the answer ends by itself (not cut at
max_tokens) within 8 words. The base model manages that about one time in five.

Success is measured on prompts no round trained on, base and final candidate on the same
prompts and seeds, straight at the inference server.
"""

from __future__ import annotations

import random
import time
from typing import Any

import pytest

from tests.conftest import wait_for
from tests.support.learning import (
    BASE,
    EVAL_THINGS,
    POLICY,
    ROUNDS,
    SAMPLES_PER_TASK,
    TRAIN_THINGS,
    Rounds,
    deliver_late,
    learning_policy,
    linked_rewards,
    openai_client,
    reward_items,
    round_seeds,
    round_things,
    sample,
    start_learning_gateway,
    success_rate,
)

pytestmark = pytest.mark.learning

EVAL_SEEDS = (11,)
MARGIN = 0.25
BUDGET_S = 600


def test_the_learner_improves_the_policy_from_its_own_rewarded_traffic(
    model_server, start_gateway, database_url, db, tmp_path, capsys
):
    import torch

    from apprentice.settings import Settings

    started = time.monotonic()
    torch.set_num_threads(2)
    rng = random.Random(7)
    policy = learning_policy(model_server.api_base)
    gateway = start_learning_gateway(start_gateway, policy)
    through_gateway, direct = openai_client(gateway.base_url), openai_client(model_server.api_base)
    settings = Settings(database_url=database_url, data_dir=tmp_path / "learner", policies=[policy])
    rounds = Rounds(settings, gateway, "learning test", started=started)

    base_results = sample(direct, BASE, EVAL_THINGS, EVAL_SEEDS, raw=False)
    base_rate = success_rate(base_results)
    rounds.mark("base eval")

    held_back: list[dict[str, Any]] = []
    round_rates = []
    for round_number in range(ROUNDS):
        things = round_things(round_number)
        results = sample(through_gateway, POLICY, things, round_seeds(round_number), raw=True)
        round_rates.append(success_rate(results))
        late_thing = things[-1] if round_number < ROUNDS - 1 else None  # its rewards come after the learner ran
        on_time = [r for r in results if r["thing"] != late_thing]
        delivery = deliver_late(gateway.url, reward_items(on_time, round_number) + held_back, rng)
        expected = [r["trajectory_id"] for r in on_time] + [i["trajectory_id"] for i in held_back]
        delivery.join()
        wait_for(
            lambda expected=expected: linked_rewards(db, expected) == len(expected),
            timeout=60,
            message="rewards linked",
        )
        held_back = reward_items([r for r in results if r["thing"] == late_thing], round_number)
        rounds.train_and_promote(round_number, f"rate {round_rates[-1]:.2f}")

    final = rounds.final
    final_results = sample(direct, final, EVAL_THINGS, EVAL_SEEDS, raw=False)
    final_rate = success_rate(final_results)
    elapsed = rounds.elapsed

    runs = db.execute(
        "SELECT status, trajectories, groups, groups_equal_rewards, groups_greedy, tokens, "
        "clip_fraction, metrics->'train'->>'tis_mean', metrics->'train'->>'behaviour_gap' "
        "FROM training_runs ORDER BY started_at"
    ).fetchall()
    with capsys.disabled():
        print(
            f"\nlearning test: base {base_rate:.3f} -> {final} {final_rate:.3f} on {len(base_results)} samples of "
            f"{len(EVAL_THINGS)} fresh prompts; rounds {[round(r, 2) for r in round_rates]}; {elapsed:.0f}s"
        )
        print("  " + "; ".join(rounds.timeline))
        for run in runs:
            print("  run", run)

    # the loop really ran as production would: routed to each new version, stale data corrected
    served = db.execute(
        "SELECT count(DISTINCT adapter_version_id) FROM calls WHERE policy = %s AND adapter_version_id IS NOT NULL",
        (POLICY,),
    ).fetchone()[0]
    assert served == ROUNDS - 1, "rounds after the first were served by the newly promoted adapter"
    stale = db.execute(
        "SELECT count(*) FROM trajectories t JOIN training_runs r ON r.id = t.trained_in_run_id "
        "WHERE t.adapter_version_id IS DISTINCT FROM r.from_version_id"
    ).fetchone()[0]
    assert stale >= SAMPLES_PER_TASK, "late rewards trained a later run on data an older version sampled"
    assert all(run[0] == "succeeded" for run in runs)

    assert len(EVAL_THINGS) >= 32 and not set(EVAL_THINGS) & set(TRAIN_THINGS)
    assert final_rate >= base_rate + MARGIN, (base_rate, final_rate)
    assert elapsed < BUDGET_S, f"the learning test took {elapsed:.0f}s"
